/* megatron_c.h - v0.1.0 - Megatron-Core's parallel machinery and a GPT trainer in C

   Do this:
       #define MEGATRON_C_IMPLEMENTATION
   before you include this file in *one* C or C++ file to create the implementation.
   Every other file includes it without the define.

       // i.e. it should look like this:
       #include ...
       #define MC_COMM_MPI                // optional: the MPI communicator backend
       #define MEGATRON_C_IMPLEMENTATION
       #include "megatron_c.h"

   OPTIONS (define before including, in every file that includes the header)
       MC_COMM_MPI        build the MPI communicator backend (needs <mpi.h>, link with mpicc).
                          Without it only the `self` backend (world size 1) exists.
       MC_ENABLE_CUDA     declare the CUDA op table (mc_ops_cuda_init) and the NCCL
                          communicator backend, both implemented in megatron_c_cuda.cu (compile
                          that file with nvcc and link it: -lnccl -lcublasLt -lcublas -lcudnn
                          -lcudart).
       MC_USE_CBLAS       the fast CPU table's GEMM calls cblas_sgemm (<cblas.h>; link a CBLAS,
                          e.g. -lopenblas). Without it: the own blocked kernel.
       -fopenmp           (a compiler flag) the fast CPU table runs its ops on several threads
                          (mc_cpu_threads); without it, on one.
       MC_WITH_CBLAS      also build mc_ops_cpu_cblas(): the CPU table with its GEMM routed
                          through cblas_sgemm (needs <cblas.h>; link a CBLAS, e.g. -lopenblas).
       MC_STATIC          make every public function static (private copy per translation unit).
       MC_FAULT_HOOKS     build the fault injection the labs use (>>core.faults, and the
                          schedule's mc_fault_schedule_drop_microbatch); ordinary builds have
                          none of it.
       MC_ASSERT(c)       override assert() for internal invariants.

   WHAT IT IS
       A small, readable re-build of Megatron-Core's core ideas:
         - a communicator table (self, MPI, NCCL) with blocking and async collectives,
         - the rank grid (Megatron's RankGenerator): every rank's coordinates and every
           group kind of Megatron's parallel_state, as a pure function of the sizes,
         - parallel state: the communicators of every group kind, created in
           Megatron's creation order on every rank, behind a group-plan fingerprint
           that turns ranks disagreeing about the plan into an immediate error,
         - the micro-batch calculator (constant, ramp-up, step schedule),
         - the op order of the pipeline schedules (no pipelining, 1F1B, interleaved 1F1B)
           and a dependency simulation of them that measures the bubble,
         - Philox4x32-10 random streams and Megatron's model-parallel RNG tracker
           (named streams, nested forks, save/restore, Megatron's seeds),
         - the training core on an op table (the fast CPU table, threaded and with a BLAS
           GEMM, held to the plain CPU reference loops; or CUDA: cuBLASLt GEMMs,
           fused kernels, cuDNN attention), which also owns the memory every communicator
           and module works on; fp32, or Megatron's --bf16 (bf16 parameters and activations,
           fp32 main parameters, gradients and optimizer state): the GPT config with
           Megatron's validation and two fingerprints,
           tensor-parallel mappings and layers (column/row parallel linear with sequence
           parallelism, vocab-parallel embedding and cross entropy), the transformer layer
           spec, block and GPTModel (pipeline stages, virtual chunks, tied embeddings,
           recompute), the schedules that run it (no pipelining, 1F1B, interleaved) with
           batched P2P, DDP gradient buckets, finalize_model_grads, the distributed
           optimizer, AdamW with the model-parallel grad norm and clipping, and
           checkpoints that reshard across TP / PP / DP,
         - the theoretical memory of a run (>>training.theoretical_memory): per pipeline stage and rank,
           Megatron's / Korthikanti et al.'s formulas and this library's own allocations, every
           term with its formula and numbers, from the config alone.

   SECTIONS (grep ">>name"; declarations first, then the implementation in the same order),
   named and ordered after Megatron-Core's packages:
       core                errors, setup, ops (the op table: memory and numerics; the CPU
                           table), timeline (what ran when: call, return and completion times),
                           config, num_microbatches, params (the flat buffer's table)
       parallel_state      rank_grid, comm (self and mpi here, nccl in megatron_c_cuda.cu),
                           the groups of initialize_model_parallel
       tensor_parallel     mappings, Column/Row parallel linear, vocab-parallel embedding and
                           cross entropy, random (Philox, the RNG tracker)
       pipeline_parallel   schedule_table, schedules
       transformer         the layer spec, the layer, the block
       models.gpt          GPTModel
       distributed         DDP buckets, finalize_model_grads
       optimizer           AdamW, the learning-rate schedule, grad-norm clipping
       dist_checkpointing  checkpoints that load under another layout

   megatron_c DOES NOT
       - call exit() or print by itself: functions return a status (MC_OK == 0,
         negative on error) and the details go to the logger callback and to
         mc_last_error() (a per-thread string naming the field, the value and the rule).
       - keep hidden global state, apart from the optional process-wide logger and
         allocator set with mc_setup() and the timeline started with mc_timeline_start().

   STEP BY STEP
       1. mc_comm_init_world(&world, &(mc_comm_desc){0})       // MPI_Init if needed
       2. mc_parallel_init(&ps, &(mc_parallel_desc){ .world = world,
                                 .grid = { .tp = 2, .pp = 2 } })
       3. mc_comm *tp = mc_parallel_group(&ps, MC_GROUP_TP);
          mc_all_reduce(tp, buf, buf, n, MC_F32, MC_SUM);
       4. mc_parallel_destroy(&ps); mc_comm_destroy(world);

       The rank grid alone needs no communication:
          mc_grid g; mc_grid_init(&g, &(mc_grid_desc){ .world = 16, .tp = 2, .pp = 4 });
          mc_grid_group_members(&g, MC_GROUP_PP, 0, ranks, 16) -> 4 ranks {0, 4, 8, 12}

       Neither do the training-core helpers:
          mc_microbatch_init(&mb, &(mc_microbatch_desc){ .global_batch_size = 512,
                             .micro_batch_size = 4, .data_parallel_size = 16 })
                                                        -> mb.num_microbatches == 8
          mc_schedule_ops(&(mc_schedule_desc){ .pp = 4, .pp_rank = 0, .num_microbatches = 8 },
                          ops, 16, &warmup)             -> 16 ops, warmup == 3:
                                                           F0 F1 F2 F3 B0 F4 B1 ... B7
          Random numbers: see the example at >>tensor_parallel.random below.

       Training (examples/pretrain_gpt.c is the whole recipe, about 600 lines). One op table
       owns the memory of everything below; give the world the same table
       (mc_comm_desc.memory, or take mc_comm_memory(world): the nccl world makes a CUDA one):
          mc_gpt_init(&gpt, &(mc_gpt_desc){ .config = cfg, .ps = &ps, .n_slots = M,
                                            .ops = mc_comm_memory(world), .dtype = MC_BF16 });
          mc_ddp_init(&ddp, &(mc_ddp_desc){ .table = &gpt.table, .grads = gpt.grads,
                                            .dp = mc_parallel_group(&ps, MC_GROUP_DP_CP),
                                            .ops = gpt.ops });
          mc_optimizer_init(&opt, &(mc_optimizer_desc){ .ddp = &ddp, .params = gpt.params,
                                                        .params_dtype = gpt.dtype,
                                                        .ps = &ps, .lr = 1e-3f });
          per iteration: mc_ddp_zero_grad, mc_gpt_zero_grad,
             mc_get_forward_backward_func(&ps)(&ps, &hooks, M, 0, &result)
                 (hooks call mc_gpt_forward_step / mc_gpt_backward_step with the batch and
                  mc_finalize_model_grads at the end), then mc_optimizer_step(&opt).

   ERROR REPORTING
       int rc = mc_grid_init(&g, &d);
       if (rc != MC_OK) fprintf(stderr, "%s: %s\n", mc_err_name(rc), mc_last_error());

   RECENT REVISION HISTORY
       0.1.0  communicators (self, MPI, NCCL), rank grid, parallel state;
              micro-batch calculator, pipeline schedule tables and simulation,
              Philox RNG streams and the RNG tracker; the training core on the CPU op
              table (config, tensor parallel, GPT, schedules, DDP, distributed optimizer,
              AdamW, checkpoints)

   LICENSE: MIT, see end of file.
*/
#ifndef MEGATRON_C_H_INCLUDED
#define MEGATRON_C_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

#define MC_VERSION_MAJOR 0
#define MC_VERSION_MINOR 1
#define MC_VERSION_PATCH 0
#define MC_VERSION_HEX ((MC_VERSION_MAJOR << 16) | (MC_VERSION_MINOR << 8) | MC_VERSION_PATCH)

/* The Megatron-LM source whose rules, names and numbers this version reproduces, for version
   statements: the commit read, its `git describe` and megatron/core/package_info.py there; the
   batch-size ramp-up (absent from core 0.18 on) is read at MC_MEGATRON_RAMPUP_TAG. */
#define MC_MEGATRON_COMMIT "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
#define MC_MEGATRON_DESCRIBE "core_v0.15.0rc7-2333-gd98e8a64dd"
#define MC_MEGATRON_PACKAGE "0.20.0"
#define MC_MEGATRON_RAMPUP_TAG "core_v0.17.0"

#if defined(MC_STATIC) && defined(__GNUC__)
#define MC_API static __attribute__((unused))   /* a TU may use only some of them */
#elif defined(MC_STATIC)
#define MC_API static
#else
#define MC_API extern
#endif
/* What megatron_c_cuda.cu defines: external under MC_STATIC too (one definition, in the .cu). */
#define MC_CUDA_API extern

#ifdef __cplusplus
extern "C" {
#endif

/* =============================================================================================
   core: errors, setup, ops (memory and numerics), config, num_microbatches, params */

/* ---------------------------------------------------------------------------------------------
   >>core.errors  One list gives the enum, mc_err_name() and mc_strerror(). 0 is success, errors < 0. */
#define MC_ERROR_MAP(XX)                                                                  \
    XX(OK, 0, "success")                                                                  \
    XX(ERR_INVALID_ARG, -1, "invalid argument")                                           \
    XX(ERR_INVALID_DESC, -2, "invalid configuration (see mc_last_error for the rule)")    \
    XX(ERR_NO_MEMORY, -3, "out of memory")                                                \
    XX(ERR_UNSUPPORTED, -4, "not supported by this build or backend")                     \
    XX(ERR_COMM, -5, "communication failed")                                              \
    XX(ERR_TIMEOUT, -6, "operation timed out (a peer did not take part)")                 \
    XX(ERR_PLAN_MISMATCH, -7, "ranks disagree on the group plan")                         \
    XX(ERR_NOT_MEMBER, -8, "this rank is not a member of the group")                      \
    XX(ERR_STATE, -9, "object is not in the right state for this call")                   \
    XX(ERR_IO, -10, "file input/output failed")                                           \
    XX(ERR_CUDA, -11, "CUDA call failed")                                                 \
    XX(ERR_NCCL, -12, "NCCL call failed")                                                 \
    XX(ERR_BUSY, -13, "object still in use")

typedef enum mc_status {
#define MC__ENUM_ITEM(name, value, text) MC_##name = value,
    MC_ERROR_MAP(MC__ENUM_ITEM)
#undef MC__ENUM_ITEM
    MC__STATUS_FORCE_INT = 0x7fffffff
} mc_status;

MC_API const char *mc_err_name(int status);   /* "MC_ERR_TIMEOUT" */
MC_API const char *mc_strerror(int status);   /* "operation timed out (...)" */
/* The detailed message of the last error raised on this thread ("" if none). */
MC_API const char *mc_last_error(void);
MC_API const char *mc_version_string(void);   /* "0.1.0" */

/* ---------------------------------------------------------------------------------------------
   >>core.setup  Optional process-wide logger and allocator. Zero means default: no logger (silent),
   malloc/free. alloc_fn and free_fn must be given together. */
typedef struct mc_logger {
    /* level: 0 panic, 1 error, 2 warning, 3 info. item: an mc_status or 0. */
    void (*func)(const char *tag, uint32_t level, int item, const char *message,
                 uint32_t line, const char *file, void *user_data);
    void *user_data;
} mc_logger;

typedef struct mc_allocator {
    void *(*alloc_fn)(size_t size, void *user_data);
    void (*free_fn)(void *ptr, void *user_data);
    void *user_data;
} mc_allocator;

typedef struct mc_desc {
    mc_logger logger;
    mc_allocator allocator;
} mc_desc;

MC_API int mc_setup(const mc_desc *desc);   /* may be called again to replace the logger */
MC_API void *mc_malloc(size_t size);
MC_API void *mc_calloc(size_t count, size_t size);
MC_API void mc_free(void *ptr);

#if defined(MC_FAULT_HOOKS)
/* ---------------------------------------------------------------------------------------------
   >>core.faults  Model faults, compiled only with MC_FAULT_HOOKS (lab02 and tests; ordinary
   builds have none of it, like mc_fault_schedule_drop_microbatch at >>pipeline_parallel.
   schedules). One fault at a time, process-wide, for every call while it is set. Each breaks
   one real code path the way a bug there would, forward and backward consistently (the
   backward is the exact gradient of the broken forward), so nothing errors or hangs:

     MC_FAULT_QKV_SHARD        layer `layer`: the linear_qkv output of TP rank `tp_rank` is
                               multiplied by `factor` (a corrupted shard)
     MC_FAULT_SOFTMAX_SCALE    layer `layer`: the attention scores are multiplied by `factor`
                               (the softmax scale is factor / sqrt(kv_channels)); q is scaled
                               in the layer, d q by the same factor
     MC_FAULT_ROW_NO_REDUCE    layer `layer`, `submodule`: its row-parallel linear (linear_proj
                               or linear_fc2) skips the forward reduction over TP (the
                               all-reduce, or under SP the reduce-scatter): every rank keeps
                               its own partial sum (its sequence rows of it under SP)
     MC_FAULT_COLUMN_NO_DGRAD_REDUCE  layer `layer`, `submodule`: its column-parallel linear
                               (linear_qkv or linear_fc1) skips the TP reduction of the input
                               grad in backward (all-reduce; reduce-scatter under SP)
     MC_FAULT_CE_SUM_EXP_MAX   vocab-parallel cross entropy: the sums of exp are all-reduced
                               with MAX instead of SUM (every rank's loss misses the other
                               ranks' probability mass)
     MC_FAULT_CE_MAX_SUM       vocab-parallel cross entropy: the row maxima are all-reduced
                               with SUM instead of MAX. Harmless while exp does not under- or
                               overflow: every rank subtracts the same shift, and the loss
                               log(sum exp(l - m)) + m - l_t does not depend on m
     MC_FAULT_NO_EMBEDDING_GRAD_SYNC  finalize_model_grads skips the embedding-group
                               all-reduce of the tied word embedding's grads
     MC_FAULT_NO_SP_GRAD_SYNC  finalize_model_grads leaves the parameters whose names start
                               with `param` (a LayerNorm's weight and bias, say) out of the
                               sequence-parallel TP all-reduce: their grads stay partial sums
     MC_FAULT_OPTIMIZER_SKIPS_PARAM  mc_optimizer_step leaves the parameters whose names start
                               with `param` unchanged (their grads are computed as usual)

       mc_fault_inject(&(mc_fault_desc){ .kind = MC_FAULT_ROW_NO_REDUCE, .layer = 2,
                                         .submodule = MC_FAULT_MLP });
       ... train ...
       mc_fault_inject(NULL);                           // off again */
typedef enum mc_fault_kind {
    MC_FAULT_OFF = 0,
    MC_FAULT_QKV_SHARD,
    MC_FAULT_SOFTMAX_SCALE,
    MC_FAULT_ROW_NO_REDUCE,
    MC_FAULT_COLUMN_NO_DGRAD_REDUCE,
    MC_FAULT_CE_SUM_EXP_MAX,
    MC_FAULT_CE_MAX_SUM,
    MC_FAULT_NO_EMBEDDING_GRAD_SYNC,
    MC_FAULT_NO_SP_GRAD_SYNC,
    MC_FAULT_OPTIMIZER_SKIPS_PARAM
} mc_fault_kind;

#define MC_FAULT_ATTENTION 0   /* submodule: self_attention (linear_qkv, linear_proj) */
#define MC_FAULT_MLP 1         /* submodule: mlp (linear_fc1, linear_fc2) */

typedef struct mc_fault_desc {
    mc_fault_kind kind;
    int layer;                 /* global layer index (the layer faults) */
    int submodule;             /* MC_FAULT_ATTENTION or MC_FAULT_MLP */
    int tp_rank;               /* MC_FAULT_QKV_SHARD */
    float factor;              /* MC_FAULT_QKV_SHARD, MC_FAULT_SOFTMAX_SCALE (0 means 1) */
    const char *param;         /* a Megatron parameter name or its prefix (copied), e.g.
                                  "decoder.final_layernorm" (weight and bias) */
} mc_fault_desc;

/* Sets the fault (a copy of *desc); NULL or MC_FAULT_OFF turns it off. */
MC_API void mc_fault_inject(const mc_fault_desc *desc);
#endif

/* @ops:declarations begin */
/* ---------------------------------------------------------------------------------------------
   >>core.ops  The op table: the memory and every numeric primitive the model uses. The CPU table is
   the reference (clear loops, fp32 math, deterministic); megatron_c_cuda.cu fills the same table
   for a GPU (mc_ops_cuda_init), so layer code never changes. Activations are [S, B, C] row-major
   (sequence first, as Megatron), so sequence-parallel shards are contiguous. "Accumulate" (+=)
   vs "overwrite" (=) is stated per op: parameter gradients always accumulate. In-place use
   (out == inp) is allowed for the element-wise ops (fill, copy, axpy, scale, gelu, dropout).

   The table is the one memory owner: tensors are op memory (host memory for the CPU table,
   device memory for CUDA), allocated, freed, filled from the host (upload), read back
   (download) and copied (copy_2d) through it. Communicators use the same table for their
   buffers (mc_comm_memory), and the model, DDP and the optimizer refuse tables that do not
   share one memory. Layer code never dereferences op memory on the host.

   Every op returns a status (MC_OK, or MC_ERR_* with mc_last_error naming the op and the
   shapes) and runs on the table's context `ctx` (for CUDA: the device, a stream, the cuBLASLt
   and cuDNN handles and a workspace; NULL for the CPU). Ops run in call order on that context;
   a CUDA op may return before its kernel has finished (download and synchronize wait).

   Precision (Megatron's --bf16 with grad_reduce_in_fp32): a `dt` argument says the storage of
   the activations and of the model's parameters, MC_F32 or MC_BF16. Parameter gradients, the
   LayerNorm and softmax statistics, losses and the optimizer state are always fp32 (float *).
   Every op computes in fp32 and rounds bf16 results to nearest-even on store, on the CPU too
   (mc_bf16_from_float), so the bf16 path runs in CI.

   Dimension letters: N = rows (tokens, S*B), C = channels, K = reduction dim, V = vocab (local
   shard), S = sequence, B = micro-batch size, NH = heads (local), HD = head dim.

   Determinism: every CPU op sums in a fixed order that depends only on the shapes, never on
   blocking or on the values. The GEMM sums each output element over k = 0 .. K-1 in order, so a
   column-parallel shard of C equals the same columns of the unsharded product bit for bit; a
   row-parallel split of K changes the order (the partial sums meet in the TP all-reduce), which
   is the only source of TP-vs-single-rank rounding differences in the linear layers. Build with
   MC_CPU_GEMM_ACC_F64 to accumulate the reference GEMM in double (smaller such differences).
   This is the reference table (mc_ops_cpu_reference). The default table (mc_ops_cpu) is the
   fast one: the same formulas on several threads (OpenMP, -fopenmp), and with MC_USE_CBLAS
   (link a CBLAS, e.g. -lopenblas) its gemm is cblas_sgemm, whose summation order is the
   BLAS's own; its results do not depend on the thread count (>>core.ops cpu fast).
   Build with MC_WITH_CBLAS (implied by MC_USE_CBLAS) to also get mc_ops_cpu_cblas: this
   reference table with only its gemm through cblas_sgemm, so that one program can run both
   and compare them.

   Dropout (dropout_* and the attention probabilities): element i is kept iff
   mc_rng_uniform_at(seed, offset + i) >= p, and kept values are scaled by 1 / (1 - p); p = 0
   keeps everything and draws nothing, p >= 1 drops everything. The mask is a pure function of
   (seed, offset + i), so backward and recompute redraw it instead of storing it, and the CPU
   and the GPU draw the same masks. */
/* Element types of tensors and collective buffers. */
typedef enum mc_dtype { MC_F32 = 0, MC_F64, MC_I32, MC_I64, MC_U8, MC_BF16, MC_DTYPE_COUNT } mc_dtype;
MC_API size_t mc_dtype_size(mc_dtype dtype);

typedef enum mc_device { MC_DEVICE_CPU = 0, MC_DEVICE_CUDA = 1 } mc_device;

/* bf16 storage: the top 16 bits of an IEEE fp32. from_float rounds to nearest, ties to even;
   NaN stays a (quiet) NaN, +-inf and overflow to +-inf as in hardware conversions. */
typedef uint16_t mc_bf16;
MC_API mc_bf16 mc_bf16_from_float(float x);
MC_API float mc_bf16_to_float(mc_bf16 x);

/* AdamW hyper-parameters of one step (see mc_ops.adamw). */
typedef struct mc_adamw_step {
    float lr, beta1, beta2, eps;
    int step;                               /* 1-based: bias corrections 1 - beta^step */
} mc_adamw_step;

/* One contiguous range of the flat buffers that AdamW steps (see mc_ops.adamw). */
typedef struct mc_adamw_span {
    size_t grad_at;                         /* first element in grad (and model_param) */
    size_t state_at;                        /* ... in m and v */
    size_t main_at;                         /* ... in the fp32 main parameters */
    size_t n;
    float weight_decay;                     /* 0 for biases and norms */
} mc_adamw_span;

typedef struct mc_ops mc_ops;
struct mc_ops {
    const char *name;                       /* "cpu", "cuda" */
    mc_device device;
    void *ctx;                              /* backend context; NULL for the CPU table */

    /* memory: bytes of op memory */
    int (*alloc)(const mc_ops *o, void **ptr, size_t bytes);           /* zero-filled */
    int (*free)(const mc_ops *o, void *ptr);                           /* NULL: nothing */
    int (*upload)(const mc_ops *o, void *dst, const void *host_src, size_t bytes);
    /* waits for the work queued before it, so host_dst holds the result on return */
    int (*download)(const mc_ops *o, void *host_dst, const void *src, size_t bytes);
    /* rows of `width` bytes: dst + r * dst_pitch = src + r * src_pitch (op memory to op memory;
       rows == 1 is a plain copy). The tensor-parallel split / gather of a last dimension. */
    int (*copy_2d)(const mc_ops *o, void *dst, size_t dst_pitch, const void *src,
                   size_t src_pitch, size_t width, size_t rows);
    int (*synchronize)(const mc_ops *o);    /* waits for every queued op; reports its error */

    /* element-wise (dt elements) */
    int (*fill)(const mc_ops *o, void *x, float value, size_t n, mc_dtype dt);
    /* dst = src, converting between the dtypes (dst_dt may differ from src_dt) */
    int (*copy)(const mc_ops *o, void *dst, const void *src, size_t n, mc_dtype dst_dt,
                mc_dtype src_dt);
    /* y += a x */
    int (*axpy)(const mc_ops *o, void *y, float a, const void *x, size_t n, mc_dtype dt);
    int (*scale)(const mc_ops *o, void *x, float a, size_t n, mc_dtype dt);
    /* *out (one fp64 value in op memory, =) = sum of x[i]^2 over the spans
       [spans[2k], spans[2k+1]) for k < n_spans (spans: 2 * n_spans size_t in op memory):
       the grad-norm partial of a flat fp32 buffer in one op. fp64 accumulation, spans in
       order. */
    int (*sum_squares)(const mc_ops *o, double *out, const float *x, const size_t *spans,
                       int n_spans);

    /* C[M,N] = alpha * op(A) op(B) + beta * C (+ bias[N] on every row when bias != NULL),
       op(A) = A[M,K] or A^T (A stored [K,M]), op(B) = B[K,N] or B^T (B stored [N,K]).
       A, B and bias are ab_dt, C is c_dt; fp32 accumulation. beta = 1 accumulates (the weight
       gradients: c_dt fp32, ab_dt bf16 under --bf16); beta = 0 never reads C (so C may hold
       garbage). K = 0 gives beta * C (+ bias). */
    int (*gemm)(const mc_ops *o, void *C, const void *A, const void *B, const void *bias, int M,
                int N, int K, int trans_a, int trans_b, float alpha, float beta, mc_dtype c_dt,
                mc_dtype ab_dt);
    int (*bias_backward)(const mc_ops *o, float *dbias, const void *dout, int N, int C,
                         mc_dtype dt);                                 /* dbias += sum rows */
    /* out[N,C] = (inp - mean) * rstd * weight + bias, mean[N] and rstd[N] = 1/sqrt(var + eps)
       (biased variance) cached for backward (either may be NULL); bias may be NULL. inp, out,
       weight and bias are dt. */
    int (*layernorm_forward)(const mc_ops *o, void *out, float *mean, float *rstd,
                             const void *inp, const void *weight, const void *bias, int N, int C,
                             float eps, mc_dtype dt);
    /* dinp += ... (dt), dweight += ..., dbias += ... (fp32; dbias may be NULL) */
    int (*layernorm_backward)(const mc_ops *o, void *dinp, float *dweight, float *dbias,
                              const void *dout, const void *inp, const void *weight,
                              const float *mean, const float *rstd, int N, int C, mc_dtype dt);
    /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the tanh approximation */
    int (*gelu_forward)(const mc_ops *o, void *out, const void *inp, size_t n, mc_dtype dt);
    int (*gelu_backward)(const mc_ops *o, void *dinp, const void *inp, const void *dout,
                         size_t n, mc_dtype dt);                       /* dinp = */
    /* The MLP's GELU fused with the GEMM beside it (Megatron's bias-GELU fusion; CUDA runs it
       in cuBLASLt's epilogue). A, B, bias, pre and out are dt; alpha 1, beta 0, fp32
       accumulation; op(A), op(B) as in gemm.
       gemm_gelu_forward:  pre[M,N] = op(A) op(B) (+ bias[N] when bias != NULL),
                           out[M,N] = gelu(pre)  (=, out != pre; pre is kept for the backward)
       gemm_gelu_backward: dpre[M,N] = gelu'(pre) * (op(A) op(B))  (=, dpre != pre)
       The CPU table composes them from gemm and gelu_forward / gelu_backward (the unfused
       numbers, bit for bit). A fused backend takes gelu of the fp32 accumulator instead of the
       rounded pre, so under bf16 the two differ by bf16 rounding. A table may leave both NULL:
       the tensor-parallel layers then compose them from gemm and gelu themselves. */
    int (*gemm_gelu_forward)(const mc_ops *o, void *out, void *pre, const void *A, const void *B,
                             const void *bias, int M, int N, int K, int trans_a, int trans_b,
                             mc_dtype dt);
    int (*gemm_gelu_backward)(const mc_ops *o, void *dpre, const void *pre, const void *A,
                              const void *B, int M, int N, int K, int trans_a, int trans_b,
                              mc_dtype dt);
    /* Causal self-attention on local heads. qkv [S,B,NH*3*HD] with per-head [q|k|v] blocks
       (Megatron's fused layout, so a TP shard of whole heads is a contiguous slice);
       out [S,B,NH*HD] (=); stats: attention_stats() floats the forward writes for the
       backward (the CPU keeps the probabilities [B,NH,S,S] = softmax(q k^T / sqrt(HD)) before
       dropout, zero above the diagonal; a flash-attention backend keeps the row log-sum-exp
       [B,NH,S]). Dropout on the probabilities uses element index ((b*NH + h)*S + t)*S + t2
       + offset of the stream `seed` (see Dropout above); the mask is redrawn, never stored. */
    size_t (*attention_stats)(const mc_ops *o, int S, int B, int NH, int HD);
    int (*attention_forward)(const mc_ops *o, void *out, float *stats, const void *qkv, int S,
                             int B, int NH, int HD, float dropout_p, uint64_t seed,
                             uint64_t offset, mc_dtype dt);
    /* dqkv = ...; out and stats as the forward wrote them */
    int (*attention_backward)(const mc_ops *o, void *dqkv, const void *dout, const void *qkv,
                              const void *out, const float *stats, int S, int B, int NH, int HD,
                              float dropout_p, uint64_t seed, uint64_t offset, mc_dtype dt);
    /* out = inp * mask / (1-p), mask element i drawn from Philox(seed, offset + i) */
    int (*dropout_forward)(const mc_ops *o, void *out, const void *inp, size_t n, float p,
                           uint64_t seed, uint64_t offset, mc_dtype dt);
    int (*dropout_backward)(const mc_ops *o, void *dinp, const void *dout, size_t n, float p,
                            uint64_t seed, uint64_t offset, mc_dtype dt);    /* dinp = */
    /* MC_ERR_INVALID_ARG naming `fn`, `what`, the index and the value when an id of ids[N] is
       outside [0, V). Backends that cannot read op memory cheaply may accept everything
       (CUDA checks only with MC_CUDA_SYNC_CHECK=1); the embedding ops write zero rows then. */
    int (*check_ids)(const mc_ops *o, const int *ids, int N, int V, const char *fn,
                     const char *what);
    /* out[N,C] = table[id - vocab_start] for ids in [vocab_start, vocab_end), else 0 */
    int (*embedding_forward)(const mc_ops *o, void *out, const int *ids, const void *table,
                             int N, int C, int vocab_start, int vocab_end, mc_dtype dt);
    int (*embedding_backward)(const mc_ops *o, float *dtable, const void *dout, const int *ids,
                              int N, int C, int vocab_start, int vocab_end, mc_dtype dt); /* += */
    /* Vocab-parallel cross-entropy pieces over a local shard logits[N,V] (dt) of global columns
       [vocab_start, vocab_start + V). All overwrite fp32 [N] results. With m = the all-reduced
       (MAX) row_max, x_t = the all-reduced (SUM) target_logit and z = the all-reduced (SUM)
       sum_exp(m):
           loss = log(z) + m - x_t
       and with label smoothing s over the global (padded) vocabulary Vg, the all-reduced
       (SUM) row_sum r gives mean_j log softmax_j = r / Vg - m - log(z), and
           loss = (1 - s) (log(z) + m - x_t) - s (r / Vg - m - log(z)). */
    int (*row_max)(const mc_ops *o, float *max, const void *logits, int N, int V, mc_dtype dt);
    int (*target_logit)(const mc_ops *o, float *out, const void *logits, const int *targets,
                        int N, int V, int vocab_start, mc_dtype dt);   /* 0 if not local */
    int (*sum_exp)(const mc_ops *o, float *sum, const void *logits, const float *max, int N,
                   int V, mc_dtype dt);
    int (*row_sum)(const mc_ops *o, float *sum, const void *logits, int N, int V,
                   mc_dtype dt);                                       /* fp64 accumulation */
    /* losses[N] (=) from the reduced pieces, in double: the formula above with K = Vg (the
       global vocabulary) and logit_sum = r (NULL without smoothing, s = 0). loss_sum (one
       fp64 value, may be NULL) = the sum of the N losses, tokens in order. */
    int (*cross_entropy_loss)(const mc_ops *o, float *losses, double *loss_sum,
                              const float *max, const float *sum_exp, const float *target_logit,
                              const float *logit_sum, int N, int K, float smoothing);
    /* dlogits[n,j] (dt, =) = dloss[n] * (softmax_j - (1 - s) onehot_j - s / vocab_global),
       softmax from the global max and sum; onehot only on the rank owning the target (targets
       outside [vocab_start, vocab_start + V), e.g. negative "ignore" ids, give none). This is
       the gradient of the smoothed loss above: (1-s)(softmax - onehot) + s(softmax - 1/Vg).
       The uniform part uses the GLOBAL vocabulary, so every TP size gives the same loss and
       gradient; Megatron instead uses the local shard size K and the local mean
       (s = alpha K / (K-1)), which makes the loss differ across TP ranks (open issues
       NVIDIA/Megatron-LM #737, #7464). s = 0: plain cross entropy. dlogits may be logits. */
    int (*cross_entropy_backward)(const mc_ops *o, void *dlogits, const void *logits,
                                  const float *max, const float *sum, const int *targets,
                                  const float *dloss, int N, int V, int vocab_start,
                                  float smoothing, int vocab_global, mc_dtype dt);
    /* AdamW over the flat buffers in one op: for every span and i < n, with
       g = grad[grad_at + i], m, v at state_at + i and p = main[main_at + i] (fp32):
       m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2,
       p -= lr (m / (1-b1^step) / (sqrt(v / (1-b2^step)) + eps) + wd p)
       (decoupled weight decay on the parameter before the step, as torch.optim.AdamW).
       model_param (may be NULL) receives p in model_dt at grad_at + i: the model's bf16 copy
       under --bf16 (Megatron copies main params to model params after the step).
       spans: n_spans entries in op memory (the optimizer uploads them once). */
    int (*adamw)(const mc_ops *o, float *main, const float *grad, float *m, float *v,
                 void *model_param, const mc_adamw_span *spans, int n_spans,
                 const mc_adamw_step *h, mc_dtype model_dt);

    /* NULL, or the account that counts this table's memory by category (see below); set it
       on a copy of the table, which still is the same memory */
    struct mc_memory_account *account;

    /* Completion markers for the timeline (>>core.timeline); optional: NULL where an op has
       finished when it returns (the CPU table). Called only while a timeline records.
       mark_record queues a marker behind every op queued on ctx so far and returns it in
       *mark (CUDA: a timing event recorded on the stream); mark_time waits until the marker
       is reached and writes when that was, in seconds of mc_timeline_now() (CUDA:
       cudaEventSynchronize, then cudaEventElapsedTime from a reference event recorded on the
       stream right after a synchronisation at a known mc_timeline_now()); mark_release frees
       it (also when it was never waited for). */
    int (*mark_record)(const mc_ops *o, void **mark);
    int (*mark_time)(const mc_ops *o, void *mark, double *t);
    void (*mark_release)(const mc_ops *o, void *mark);
};

/* The CPU tables. mc_ops_cpu() is the fast one (threads, a BLAS when built with MC_USE_CBLAS;
   see >>core.ops cpu fast for what it changes), or the reference when MC_CPU_REFERENCE=1 is
   in the environment. mc_ops_cpu_reference(): the plain single-threaded loops described above,
   the oracle the fast table is tested against. mc_ops_cpu_fast(): the fast one, whatever the
   environment. All three are the same (host) memory. */
MC_API const mc_ops *mc_ops_cpu(void);
MC_API const mc_ops *mc_ops_cpu_reference(void);
MC_API const mc_ops *mc_ops_cpu_fast(void);
/* Threads the fast table runs (1 without OpenMP): MC_CPU_THREADS, else OMP_NUM_THREADS, else
   this rank's share of the host's cores (cores / ranks on the host, at least 1).
   mc_cpu_set_threads(n) overrides it for the process (0: back to the default). */
MC_API int mc_cpu_threads(void);
MC_API void mc_cpu_set_threads(int n);
/* The BLAS the fast table's GEMM calls ("OpenBLAS 0.3.21"), or NULL (the blocked kernel). */
MC_API const char *mc_cpu_blas(void);
/* The cache-blocked reference GEMM of the CPU table (the reference table's gemm, and the fast
   table's without a BLAS); public so that benchmarks can compare it with a BLAS side by side.
   fp32, row-major, same contract as mc_ops.gemm without bias. */
MC_API void mc_cpu_gemm_blocked(float *C, const float *A, const float *B, int M, int N, int K,
                                int trans_a, int trans_b, float alpha, float beta);
/* The CPU table with one op swapped for an accelerated library: gemm is cblas_sgemm (fp32
   storage: bf16 operands are widened first, as in the reference). Same memory as
   mc_ops_cpu_reference() (host, ctx NULL), so it drops in wherever the reference table goes;
   every other op is the reference one (single-threaded). Its sums run in the BLAS library's
   order, so results match the reference to rounding, not bit for bit. NULL in builds without
   MC_WITH_CBLAS or MC_USE_CBLAS (a caller falls back to mc_ops_cpu_reference()). */
MC_API const mc_ops *mc_ops_cpu_cblas(void);
/* 1 when the two tables work on the same memory (the same table, or the same device and
   context), so that one's buffers are valid for the other. */
MC_API int mc_ops_same_memory(const mc_ops *a, const mc_ops *b);
/* Bytes of n elements of dt (mc_dtype_size(dt) * n). */
MC_API size_t mc_dtype_bytes(mc_dtype dt, size_t n);

/* Memory accounting. Every block of op memory the library allocates says what it is for:
     parameters     the model's flat parameter buffer (mc_gpt_init)
     gradients      its flat gradient buffer (mc_gpt_init)
     optimizer      Adam m and v, fp32 main parameters, the step's span tables (mc_optimizer_init)
     activations    the model's arenas (one per chunk and slot, one scratch) and tensor-parallel
                    scratch a layer allocates for one call
     communication  communicator buffers (mc_comm_alloc: the schedule's P2P receive buffers;
                    host-collective staging on device memory; the self backend's queued
                    messages) and finalize's packed sequence-parallel grads
   A table with an account counts them: bytes held now and the most held at once, per category
   and in total. The peaks are what a run needs, the numbers mc_memory_estimate predicts.

       mc_memory_account acct = {0};
       mc_ops ops = *mc_ops_cpu();
       ops.account = &acct;                 // give &ops to the world, model, DDP, optimizer
       ...  acct.peak[MC_MEMORY_ACTIVATIONS] ...
       mc_memory_account_destroy(&acct);

   Blocks allocated before the account was set, or with the table's raw alloc, are not counted
   (freeing them through mc_ops_free is fine). An account is not thread-safe. */
typedef enum mc_memory_category {
    MC_MEMORY_PARAMETERS = 0,
    MC_MEMORY_GRADIENTS,
    MC_MEMORY_OPTIMIZER,
    MC_MEMORY_ACTIVATIONS,
    MC_MEMORY_COMMUNICATION,
    MC_MEMORY_CATEGORY_COUNT
} mc_memory_category;

MC_API const char *mc_memory_category_name(int category);   /* "parameters", ... */

typedef struct mc_memory_account {
    double bytes[MC_MEMORY_CATEGORY_COUNT];   /* held now */
    double peak[MC_MEMORY_CATEGORY_COUNT];    /* the most held at once, category by category */
    double total, peak_total;                 /* every category: held now, the most at once */
    long long blocks;                         /* live counted blocks */
    /* Private: the live blocks (pointer, bytes, category), open addressing. */
    void *slots;
    size_t n_slots, n_used;
} mc_memory_account;

/* Op memory through a table: o->alloc / o->free, counted when o->account is set. A block the
   account cannot record (out of host memory) is freed again: MC_ERR_NO_MEMORY. */
MC_API int mc_ops_alloc(const mc_ops *o, mc_memory_category category, void **ptr, size_t bytes);
MC_API int mc_ops_free(const mc_ops *o, void *ptr);
/* Peaks from now on: every peak becomes what is held now (e.g. after setting up). */
MC_API void mc_memory_account_reset_peaks(mc_memory_account *a);
/* Frees the account's own table (not the blocks) and zeroes it. */
MC_API void mc_memory_account_destroy(mc_memory_account *a);

#if defined(MC_ENABLE_CUDA)
/* The CUDA table (megatron_c_cuda.cu). Zero means default. */
typedef struct mc_cuda_desc {
    int device;                 /* CUDA ordinal; default 0 (-1: the current device) */
    size_t workspace_bytes;     /* cuBLASLt / cuDNN workspace; default 32 MiB */
    int attention;              /* 0 auto: bf16 without dropout runs cuDNN's fused SDPA, or the
                                   own flash kernel (head dim 32 or 64) where cuDNN cannot
                                   build the graph; everything else the reference kernel.
                                   1 own kernels only (flash where it applies), 2 cuDNN only
                                   (an error where it cannot), 3 the reference kernel only
                                   (fp32 math, any dtype and dropout). The environment
                                   MC_CUDA_ATTENTION=auto|own|cudnn|ref overrides it */
    int sync_check;             /* 1: synchronise after every op and check it (slow; also
                                   MC_CUDA_SYNC_CHECK=1 in the environment) */
    int tf32;                   /* 1: allow TF32 in fp32 GEMMs (default off: fp32 GEMMs match
                                   the CPU to 1e-5) */
    int unfused;                /* 1: gemm_gelu_forward / _backward run as a GEMM and a GELU
                                   kernel (default 0: under bf16, GELU in cuBLASLt's epilogue
                                   where cuBLASLt has an algorithm; fp32 always unfused).
                                   MC_CUDA_FUSE=0 in the environment turns the fusion off
                                   without a rebuild */
    int deterministic;          /* 1: every sum in one fixed order, so two runs (and two ranks
                                   computing a replicated region) agree bit for bit: the
                                   gradient-norm, bias, LayerNorm-parameter, embedding and loss
                                   sums without atomics, attention on the own kernels unless
                                   cuDNN is asked for (Megatron's --deterministic-mode). Slower
                                   backward; default 0. MC_CUDA_DETERMINISTIC=1 in the
                                   environment sets it */
} mc_cuda_desc;
/* Fills *ops (written only on success) with the CUDA table and a new context on desc->device
   (stream, cuBLASLt and cuDNN handles, workspace). MC_ERR_CUDA naming the call when the device
   or a library cannot start. */
MC_CUDA_API int mc_ops_cuda_init(mc_ops *ops, const mc_cuda_desc *desc);
MC_CUDA_API void mc_ops_cuda_destroy(mc_ops *ops);
/* Visible CUDA devices (0 without a driver or a device; never an error). */
MC_CUDA_API int mc_cuda_device_count(void);
/* One line about the table's device and libraries ("NVIDIA H200, sm_90, 139.8 GiB, cuBLASLt
   13.0, cuDNN 9.14, attention auto"); "" for a table that is not CUDA. */
MC_CUDA_API const char *mc_ops_cuda_describe(const mc_ops *ops);
/* Peak bytes of device memory allocated through the table since init (or the last reset). */
MC_CUDA_API size_t mc_ops_cuda_peak_bytes(const mc_ops *ops, int reset);
/* The kernels the last attention forward and backward ran ("forward cudnn, backward cudnn";
   each one of cudnn, flash, reference, or none yet), and after "; " why cuDNN was refused
   where it was ("" for a table that is not CUDA). */
MC_CUDA_API const char *mc_ops_cuda_attention_kernels(const mc_ops *ops);
/* "on: GELU in the GEMM epilogue, forward 24 fused / 0 unfused, backward 24 fused / 0
   unfused" (the calls since init), "off: ..." when fusion is off, and after "; last
   unfused: " why the last call with fusion on ran unfused ("" for a table that is not CUDA). */
MC_CUDA_API const char *mc_ops_cuda_fusion(const mc_ops *ops);
/* Per-op timing with CUDA events, summed per category (opt-in: it adds two events per op).
   enable 1 starts a fresh window; read waits for the device, writes the milliseconds of each
   category since the window opened and opens a new one. Communication is the NCCL operations
   of communicators whose memory is this table (they overlap compute: the categories need not
   add up to the step time). */
typedef enum mc_profile_category {
    MC_PROF_GEMM = 0, MC_PROF_ATTENTION, MC_PROF_NORM, MC_PROF_LOSS, MC_PROF_OPTIMIZER,
    MC_PROF_OTHER, MC_PROF_COMM, MC_PROF_COUNT
} mc_profile_category;
MC_CUDA_API int mc_ops_cuda_profile(const mc_ops *ops, int enable);
MC_CUDA_API int mc_ops_cuda_profile_read(const mc_ops *ops, double ms[MC_PROF_COUNT]);
#endif

/* @ops:declarations end */

/* @timeline:declarations begin */
/* ---------------------------------------------------------------------------------------------
   >>core.timeline  What ran when: Megatron's timers, per event instead of per name. While a
   timeline is started the library records one event per schedule op, collective, wait and
   phase of finalize_model_grads, the optimizer and checkpoints, each with three times:
       t_call      the host made the call
       t_return    the call returned to the host
       t_complete  the work it started had finished: on the device for the op table's work,
                   on the network for a collective (0 while that is not known)
   An application records its own phases (data, logging, ...) with mc_timeline_begin / _end.
   While no timeline is started nothing is recorded: every trace point is one pointer test.

       static mc_timeline_event events[1 << 14];
       mc_timeline tl;
       mc_timeline_start(&tl, &(mc_timeline_desc){ .events = events, .capacity = 1 << 14 });
       ... one iteration ...
       mc_timeline_stop(&tl);                    // waits for the markers still pending
       for (long long id = mc_timeline_first(&tl); id < tl.n_events; id++) {
           const mc_timeline_event *e = mc_timeline_event_at(&tl, id);
           ... e->kind, e->name, e->comm, e->t_call, e->t_return, e->t_complete ...
       }

   Events by kind, with the names the library gives them:
     SPAN        a phase: "finalize_model_grads" and inside it "finish_grad_sync",
                 "sp_grad_all_reduce", "embedding_grad_all_reduce", "num_tokens";
                 "ddp_bucket" (index = bucket, chunk: its scale and its launch);
                 "optimizer_step" and inside it "grad_norm", "clip_grads" (index 1 when the
                 grads were scaled, else 0), "adamw", "param_all_gather";
                 "checkpoint_save", "checkpoint_load"; and the application's own
     COMPUTE     a schedule op, "forward" / "backward" (index = micro-batch, chunk), from the
                 forward_step / backward_step call to its return (taken next to the schedule
                 trace's op_start / op_end, mc_schedule_hooks.clock)
     COLLECTIVE  a blocking communication call on `comm`: "all_reduce", "all_gather",
                 "reduce_scatter", "broadcast", "send", "recv", "batch_send_recv", "barrier"
     ASYNC       the same, started by an _async call: t_return is the launch's return
     WAIT        mc_wait, or an mc_test that found the operation done, named after the
                 operation (ref = its ASYNC event)
     MARK        an instant: "grad_sync_on" (index = chunk: the schedule enabled grad sync
                 before that chunk's last backward), "lr_scheduler_step"
   Every event records the span or schedule op open around it (parent, depth): a collective
   inside a backward, or a wait inside finish_grad_sync, says where it ran.

   Completion (t_complete):
     - where the work is done when the call returns (the CPU op table; the self and mpi
       backends' blocking calls): t_complete = t_return;
     - an ASYNC operation has completed when a wait or a test finds it finished: t_complete is
       the return of that wait (on mpi an upper bound: MPI moves the operation along inside
       other MPI calls in between); 0 until then;
     - a span or schedule op has completed when its own work and every synchronous event
       inside it have (ASYNC events outlive the span that started them: their completion is
       their own);
     - op tables and communicators with completion markers (mc_ops.mark_record,
       mc_comm_ops.mark_record: e.g. CUDA events on a stream): when the call returns the
       library records a marker behind the work the call queued (on the op table's context
       for spans and schedule ops, on the communicator for collectives, asynchronous ones
       included); mc_timeline_flush (and stop) waits for the markers and sets t_complete to
       their times. A kernel or an NCCL collective still running when the host went on then
       shows as such, and t_complete may also come before t_return.
   Times are seconds of mc_timeline_now() (CLOCK_MONOTONIC where the build has it; marker
   implementations report in the same clock).

   The ring keeps the last `capacity` events (n_events counts every one; those before
   mc_timeline_first are gone, their markers waited for and released). One timeline per
   process and not thread-safe; flush it before destroying a communicator or an op table
   whose markers may still be pending. */
typedef enum mc_timeline_kind {
    MC_TIMELINE_SPAN = 0,
    MC_TIMELINE_COMPUTE,
    MC_TIMELINE_COLLECTIVE,
    MC_TIMELINE_ASYNC,
    MC_TIMELINE_WAIT,
    MC_TIMELINE_MARK,
    MC_TIMELINE_KIND_COUNT
} mc_timeline_kind;

#define MC_TIMELINE_NAME_MAX 32
#define MC_TIMELINE_MAX_DEPTH 16

typedef struct mc_timeline_event {
    long long id;                   /* 0, 1, ... since mc_timeline_start */
    mc_timeline_kind kind;
    char name[MC_TIMELINE_NAME_MAX];
    char comm[48];                  /* the communicator (mc_comm.name), or "" */
    int index;                      /* micro-batch, bucket, chunk of a mark, ...; -1 */
    int chunk;                      /* model chunk of a schedule op or a bucket; -1 */
    int depth;                      /* spans and schedule ops open around it */
    long long parent;               /* the innermost of them; -1 at top level */
    long long ref;                  /* WAIT: the ASYNC event it finished; -1 */
    size_t bytes;                   /* the data a communication call hands over on this rank
                                       (reduce_scatter: its whole input; a batch: every op) */
    int status;                     /* what the call returned (MC_OK or the error) */
    double t_call, t_return, t_complete;
    /* Private: a completion marker not resolved yet, and whose it is. */
    void *mark;
    const struct mc_ops *mark_ops;
    struct mc_comm *mark_comm;
} mc_timeline_event;

typedef struct mc_timeline_desc {
    mc_timeline_event *events;      /* required: the ring [capacity], owned by the caller */
    int capacity;                   /* required, >= 1 */
} mc_timeline_desc;

typedef struct mc_timeline {
    mc_timeline_desc desc;
    long long n_events;             /* recorded since start; the ring holds the last capacity */
    int recording;                  /* 1 between start and stop */
    /* Private: the spans and schedule ops open now. */
    int depth;
    long long open[MC_TIMELINE_MAX_DEPTH];
} mc_timeline;

/* Seconds on the timeline's clock (monotonic; only differences mean something). */
MC_API double mc_timeline_now(void);
/* Initialises *tl (never read) and makes it the process's timeline; a timeline recording
   before is flushed and stopped. MC_ERR_INVALID_DESC naming the field for a bad desc. */
MC_API int mc_timeline_start(mc_timeline *tl, const mc_timeline_desc *desc);
/* Waits for every pending marker, fills the completion times and completes the spans from
   their events; recording goes on. Returns the first marker error (the others still
   resolve). */
MC_API int mc_timeline_flush(mc_timeline *tl);
/* Flushes, then stops recording (the events stay readable). */
MC_API int mc_timeline_stop(mc_timeline *tl);
/* The first id the ring still holds, and the event of an id (NULL when gone or not yet
   recorded). */
MC_API long long mc_timeline_first(const mc_timeline *tl);
MC_API const mc_timeline_event *mc_timeline_event_at(const mc_timeline *tl, long long id);
/* An application's own phase: begin returns its id (-1 while nothing records; end ignores
   -1), end closes it and whatever was opened inside it and left open. ops (may be NULL): the
   op table whose queued work the span's completion waits for. */
MC_API long long mc_timeline_begin(const char *name, int index);
MC_API void mc_timeline_end(long long span, const struct mc_ops *ops);
/* An instant. */
MC_API void mc_timeline_mark(const char *name, int index);
MC_API const char *mc_timeline_kind_name(int kind);   /* "span", "compute", ... */

/* @timeline:declarations end */

/* @config:declarations begin */
/* ---------------------------------------------------------------------------------------------
   >>core.config  The GPT/transformer config: Megatron's TransformerConfig + ModelParallelConfig
   subset for a dense GPT. Zero means Megatron's default, except where a field says otherwise.

   default table:  ffn_hidden_size 4*hidden | kv_channels hidden/heads | num_query_groups heads
                   layernorm_epsilon 1e-5   | init_method_std 0.02      | hidden/attention dropout 0.1
                   make_vocab_size_divisible_by 128 | max_position_embeddings seq_length
                   tp, pp 1 | vpp 0 (1 becomes 0: one chunk is not interleaved) | seed 1234
   Dropout: 0 selects the default 0.1; MC_DROPOUT_OFF (negative) switches dropout off, and the
   resolved config then holds 0. A resolved config is marked by padded_vocab_size != 0 (never set
   it yourself): resolving it again keeps its dropouts as they are (0 stays off) and recomputes
   padded_vocab_size, so a resolved config may be edited (e.g. another TP size) and re-resolved.
   validate, the fingerprints and math_diff resolve a copy first, so they accept either form.

   Fingerprints (64-bit FNV-1a over field names and values of the resolved config):
     math    what a checkpoint's numbers mean: num_layers, hidden_size, num_attention_heads,
             ffn_hidden_size, kv_channels, num_query_groups, vocab_size (the ORIGINAL size) and
             make_vocab_size_divisible_by, max_position_embeddings, layernorm_epsilon,
             untie_embeddings_and_output_weights. Left out on purpose: the padded vocabulary
             (it depends on TP; loading reshards and re-pads it), seq_length (any length up to
             max_position_embeddings runs the same function), the dropouts and init_method_std
             (they change training, not the function a loaded checkpoint computes), the
             layout, recompute, micro_batch_size and seed.
     layout  tensor / pipeline / virtual pipeline sizes and sequence_parallel: may differ
             between save and load (the loader reshards). DP is not part of the config. */
#define MC_DROPOUT_OFF (-1.0f)
#define MC_MAX_VPP 8

typedef enum mc_recompute_granularity {
    MC_RECOMPUTE_NONE = 0, MC_RECOMPUTE_FULL, MC_RECOMPUTE_SELECTIVE
} mc_recompute_granularity;
typedef enum mc_recompute_method {
    MC_RECOMPUTE_METHOD_NONE = 0, MC_RECOMPUTE_UNIFORM, MC_RECOMPUTE_BLOCK
} mc_recompute_method;

typedef struct mc_gpt_config {
    /* math (part of the math fingerprint: a checkpoint must match it) */
    int num_layers;                    /* required */
    int hidden_size;                   /* required */
    int num_attention_heads;           /* required */
    int ffn_hidden_size;
    int kv_channels;                   /* kv_channels * heads must equal hidden_size here */
    int num_query_groups;              /* only == heads (no GQA) is implemented */
    int vocab_size;                    /* required: original vocabulary (padded inside) */
    int make_vocab_size_divisible_by;
    int max_position_embeddings;       /* default seq_length */
    int seq_length;                    /* required (not in the math fingerprint) */
    float layernorm_epsilon;
    float init_method_std;             /* not in the math fingerprint */
    int untie_embeddings_and_output_weights;   /* 0 = tied (Megatron GPT default) */
    float hidden_dropout;              /* not in the math fingerprint */
    float attention_dropout;           /* not in the math fingerprint */
    /* layout (layout fingerprint: may differ between save and load) */
    int tensor_model_parallel_size;
    int pipeline_model_parallel_size;
    int virtual_pipeline_model_parallel_size;  /* 0 = not interleaved */
    int sequence_parallel;
    /* performance only (no fingerprint) */
    mc_recompute_granularity recompute_granularity;
    mc_recompute_method recompute_method;
    int recompute_num_layers;          /* full: 1 .. num_layers / pp; selective: 0 */
    int micro_batch_size;              /* required for activation sizing */
    /* run */
    int seed;                          /* > 0 */
    int padded_vocab_size;             /* resolved: ceil(vocab / (div * tp)) * div * tp */
} mc_gpt_config;

/* Fills defaults into *out (in may equal out). MC_ERR_INVALID_ARG for NULL pointers only: the
   values are checked by mc_gpt_config_validate. */
MC_API int mc_gpt_config_resolve(mc_gpt_config *out, const mc_gpt_config *in);
/* Checks every rule that applies (Megatron §13 subset) on the resolved config:
     required fields (> 0): num_layers, hidden_size, num_attention_heads, seq_length,
       vocab_size, micro_batch_size; other sizes > 0; tp, pp >= 1; 0 <= vpp <= MC_MAX_VPP;
     num_attention_heads % tp and ffn_hidden_size % tp; kv_channels * heads == hidden_size;
     num_query_groups == heads (no GQA) and Megatron's "multiple or divisor of tp";
     num_layers % pp; with vpp: pp > 1 and num_layers % (pp * vpp) (Megatron-LM #468: upstream
       once divided silently and built fewer layers);
     sequence parallelism needs tp > 1, and seq_length % tp;
     recompute: full needs a method and 1 <= recompute_num_layers <= num_layers / pp;
       selective needs no method and recompute_num_layers 0; none needs neither;
     dropouts in [0, 1); layernorm_epsilon > 0; init_method_std > 0; seed > 0;
     max_position_embeddings >= seq_length.
   Writes one line per violation ("field (value) rule", ending in '\n') into report (may be
   NULL; truncated to report_cap, always NUL-terminated) and returns the number of violations
   (0 = valid). */
MC_API int mc_gpt_config_validate(const mc_gpt_config *cfg, char *report, size_t report_cap);
MC_API uint64_t mc_gpt_config_math_fingerprint(const mc_gpt_config *cfg);
MC_API uint64_t mc_gpt_config_layout_fingerprint(const mc_gpt_config *cfg);
/* Names every math field that differs ("layernorm_epsilon: 1e-05 vs 1e-06; ..."); returns the
   count (out may be NULL; truncated to cap, always NUL-terminated). */
MC_API int mc_gpt_config_math_diff(const mc_gpt_config *a, const mc_gpt_config *b, char *out,
                                   size_t cap);
/* ceil(vocab / (divisible_by * tp)) * divisible_by * tp, e.g. 50257 -> 50304 (tp 1), 50432
   (tp 2), 51200 (tp 8). MC_ERR_INVALID_ARG for a value <= 0 or a result beyond INT_MAX. */
MC_API int mc_gpt_padded_vocab_size(int vocab, int divisible_by, int tp);

/* @config:declarations end */

/* ---------------------------------------------------------------------------------------------
   >>core.num_microbatches  Megatron's num-microbatches calculator.

       global batch = micro batch x num_microbatches x DP        e.g. 512 = 4 x 8 x 16

   DP is the data-parallel size, world / (tp * pp * cp): TP, PP and CP ranks share samples.
   The desc picks one of three modes:
     constant  GBS must be a multiple of MBS * DP, unless decrease_batch_size_if_needed rounds
               the *running* batch down to one (the reported global batch stays GBS);
               num_microbatches must come out >= 1. update() changes nothing.
     ramp-up   rampup = {start, increment, samples}: Megatron up to core_v0.17 (removed after).
               n_inc = (GBS - start) / increment, per_inc = samples / n_inc (a double):
                 consumed >  samples:  batch = GBS
                 consumed <= samples:  batch = start + floor(consumed / per_inc) * increment
               Special cases where Megatron divides by zero: GBS == start is accepted here and
               runs at GBS throughout; samples == 0 with GBS > start is rejected.
     step      step_schedule "THRESHOLD:BS THRESHOLD:BS ..." (Megatron HEAD): the batch is the
               BS of the last entry whose threshold <= consumed. Spaces or commas separate the
               entries; both numbers take a K, M, B or T suffix (x1e3, 1e6, 1e9, 1e12) and may
               be decimal ("1.5K"); with seq_length > 0 thresholds count tokens and are divided
               by seq_length. Entries are sorted; the first threshold must be 0, thresholds
               must increase strictly and every BS must be > 0. GBS is the last entry's BS
               (global_batch_size must be left 0, as Megatron refuses both); not combinable with
               decrease_batch_size_if_needed. num_microbatches may be 0 before the first check.
   mc_microbatch_update(calc, consumed, 1) is what the training loop calls every iteration:
   with the consistency check the current batch must be a multiple of MBS * DP (skipped when
   decreasing); without it, a non-multiple is floored silently. Init runs update(0) unchecked. */

typedef enum mc_microbatch_mode {
    MC_MICROBATCH_UNSET = 0,   /* a zeroed calculator: update() refuses it */
    MC_MICROBATCH_CONSTANT,
    MC_MICROBATCH_RAMPUP,
    MC_MICROBATCH_STEP
} mc_microbatch_mode;

typedef struct mc_rampup {
    int start;                 /* first global batch size, > 0 */
    int increment;             /* > 0; GBS - start must be a multiple of it */
    long long samples;         /* consumed samples over which the batch grows, >= 0 */
} mc_rampup;

/* Zero means default / unset in every field. */
typedef struct mc_microbatch_desc {
    int global_batch_size;     /* required (> 0) unless step_schedule is given */
    int micro_batch_size;      /* required, > 0 */
    int data_parallel_size;    /* required, > 0 */
    int decrease_batch_size_if_needed;
    mc_rampup rampup;          /* all zero: no ramp-up */
    const char *step_schedule; /* NULL: none. Parsed by init, not kept */
    int seq_length;            /* step schedule only: > 0 makes thresholds token counts */
} mc_microbatch_desc;

#define MC_MAX_BATCH_STEPS 64

typedef struct mc_microbatch_calc {
    mc_microbatch_mode mode;
    mc_microbatch_desc desc;                /* as given, step_schedule set to NULL */
    int global_batch_size;                  /* the final batch: GBS, or the last step's BS */
    int current_global_batch_size;          /* after the last update */
    int current_running_global_batch_size;  /* rounded down to a multiple of MBS * DP when
                                               decreasing, else equal to the current batch */
    int num_microbatches;                   /* running batch / (MBS * DP) */
    /* Private. */
    double rampup_samples_per_increment;    /* 0 when GBS == start */
    int n_steps;
    long long step_threshold[MC_MAX_BATCH_STEPS];   /* in samples, ascending */
    int step_batch[MC_MAX_BATCH_STEPS];
} mc_microbatch_calc;

/* Validates the desc (MC_ERR_INVALID_DESC naming the field, the value and Megatron's rule)
   and computes the batch for 0 consumed samples. E.g. "global batch size (500) is not
   divisible by micro batch size (4) times data parallel size (16) = 64". */
MC_API int mc_microbatch_init(mc_microbatch_calc *calc, const mc_microbatch_desc *desc);
/* Recomputes the current batch and num_microbatches for `consumed_samples`. */
MC_API int mc_microbatch_update(mc_microbatch_calc *calc, long long consumed_samples,
                                int consistency_check);
/* The consumed-sample counts at which the global batch changes, ascending, starting with 0:
   {0} when constant, every threshold of a step schedule, and for a ramp-up the first count of
   each increment plus samples + 1 when the batch still changes there. Writes at most cap
   values (out may be NULL to count) and returns the total count. Does not touch calc. */
MC_API int mc_microbatch_change_points(const mc_microbatch_calc *calc, long long *out, int cap);

/* @params:declarations begin */

/* ---------------------------------------------------------------------------------------------
   >>core.params  One contiguous parameter buffer per rank with a named table (llm.c's layout, with
   Megatron's names and attributes). Parameters are registered in module order; the layout then
   places them in REVERSE registration order (about the order backward produces gradients),
   groups them into DDP buckets and pads them as the distributed optimizer needs (§11.3:
   each param start to a multiple of 64, each bucket end to lcm(DP, 128), the shared embedding
   in its own bucket). Gradients and optimizer state use the same layout, so the gradient
   reduction and the optimizer step are flat loops over buckets. */
#define MC_PARAM_NAME_MAX 96

typedef struct mc_param_info {
    char name[MC_PARAM_NAME_MAX];   /* Megatron key with the GLOBAL layer index, e.g.
                                       "decoder.layers.3.mlp.linear_fc1.weight" */
    int ndim;                       /* 1 or 2 */
    int global_shape[2];
    int local_shape[2];             /* this rank's shard */
    int partition_dim;              /* -1: replicated across TP; else the split dimension */
    int partition_stride;           /* 1 unless strided (Megatron's partition_stride) */
    int tensor_model_parallel;      /* split across TP (counted on every TP rank in the norm) */
    int sequence_parallel;          /* replicated but its grad is partial under SP: TP all-reduce
                                       in finalize (LayerNorm params, row-parallel bias) */
    int shared;                     /* the last stage's tied copy of the word embedding: skipped
                                       by the grad norm, not saved by checkpoints */
    int shared_embedding;           /* word embedding or its tied copy: own DDP bucket and
                                       embedding-group all-reduce */
    int no_weight_decay;            /* biases and norm parameters */
    int chunk;                      /* virtual pipeline chunk (0 unless interleaved) */
    int layer;                      /* global layer index, -1 outside the decoder layers */
    size_t offset;                  /* element offset in the flat buffer (set by the layout) */
    size_t numel;                   /* local element count */
} mc_param_info;

typedef struct mc_bucket {
    size_t start, end;              /* [start, end) of the flat buffer, end padded */
    int first_param, n_params;      /* indices into mc_param_table.order[] */
    int chunk;
    int shared_embedding;
} mc_bucket;

typedef struct mc_param_layout_desc {
    int dp_size;                    /* data-parallel (x CP) size the buckets are reduced over */
    int distributed_optimizer;      /* pad for reduce-scatter shards (§11.3) */
    size_t bucket_size;             /* elements; 0 = one bucket per chunk (overlap off) */
    int pp_rank;                    /* Megatron disables bucketing on pp_rank > 0 (and on
                                       every chunk after the first: disable_bucketing) */
} mc_param_layout_desc;

typedef struct mc_param_table {
    int count, capacity;
    mc_param_info *info;            /* registration order */
    int *order;                     /* info indices in layout order (reverse registration) */
    size_t total;                   /* elements in the flat buffer, padding included */
    int n_buckets;
    mc_bucket *buckets;
    mc_param_layout_desc layout;
} mc_param_table;

/* Registers a parameter (shapes, flags from `proto`; name/offset ignored in proto). Returns the
   index, or a negative status. Checked: unique name, ndim 1 or 2, positive shapes, local ==
   global outside partition_dim, tensor_model_parallel set exactly when partition_dim >= 0,
   chunk < MC_MAX_VPP, shared only with shared_embedding. Stride 0 becomes 1; a 1-D param is
   stored as [n] x 1. Adding after a layout drops the layout (offsets would move). */
MC_API int mc_param_table_add(mc_param_table *t, const char *name, const mc_param_info *proto);
MC_API int mc_param_table_find(const mc_param_table *t, const char *name);   /* -1 if none */
/* Sets every offset, order[] and the buckets; may be called again with another desc. Chunks
   are placed one after the other (chunk 0 first), each in reverse registration order; a
   bucket closes once end - bucket start >= bucket_size. E.g. DP 2, distributed optimizer,
   params a(10) b(100) c(30) registered in that order: c [0,30), b [64,164), a [192,202), one
   bucket [0,256). */
MC_API int mc_param_table_layout(mc_param_table *t, const mc_param_layout_desc *desc);
MC_API void mc_param_table_destroy(mc_param_table *t);

/* Deterministic "CPU initialisation" (§3.1): element (i, j) of the GLOBAL [rows, cols] master of
   parameter `name` is normal(0, std) drawn from Philox keyed by (seed, hash(name)) at counter
   i * cols + j, so a shard is the same numbers whatever the TP size and the pipeline stage.
   Writes the local shard [local_rows, local_cols] of partition `partition_dim` (-1 = whole
   tensor) for tp_rank of tp_size with Megatron's stride rule. 1-D tensors: rows = 1. */
MC_API void mc_init_normal_shard(float *local, const char *name, int rows, int cols,
                                 int partition_dim, int stride, int tp_rank, int tp_size,
                                 float std, uint64_t seed);

/* @params:declarations end */

/* =============================================================================================
   parallel_state: the rank grid, the communicators, the groups */

/* ---------------------------------------------------------------------------------------------
   >>parallel_state.rank_grid  Megatron's RankGenerator: a pure function of the sizes, no communication.

   The order string lists the axes from fastest to slowest varying (default "tp-cp-ep-dp-pp").
   Axes of size 1 that are missing from the order are appended; a missing axis of size > 1 is
   an error. The dense grid is (tp, cp, dp, pp) with ep = 1; the expert grid is
   (etp, ep, edp, pp) with cp = 1:
       world = TP * CP * DP * PP = ETP * EP * EDP * PP    (EP is not an extra world factor) */

#define MC_MAX_RANKS 1048576
#define MC_ORDER_MAX 32

typedef enum mc_group_kind {
    MC_GROUP_TP = 0,
    MC_GROUP_PP,
    MC_GROUP_DP,
    MC_GROUP_DP_CP,
    MC_GROUP_CP,
    MC_GROUP_MP,                 /* model parallel: tp-pp */
    MC_GROUP_TP_DP,
    MC_GROUP_TP_DP_CP,
    MC_GROUP_TP_CP,
    MC_GROUP_EMBEDDING,          /* first and last rank of each pp group (one rank when PP = 1) */
    MC_GROUP_POSITION_EMBEDDING, /* first rank of each pp group */
    MC_GROUP_EP,
    MC_GROUP_EXPERT_TP,
    MC_GROUP_TP_EP,
    MC_GROUP_TP_EP_PP,
    MC_GROUP_EXPERT_DP,
    MC_GROUP_COUNT
} mc_group_kind;

/* Sizes; zero means default. */
typedef struct mc_grid_desc {
    int world;          /* required, >= 1 */
    int tp;             /* default 1 */
    int pp;             /* default 1 */
    int vpp;            /* virtual pipeline chunks per stage; 0 = not interleaved; needs pp > 1 */
    int cp;             /* default 1 */
    int ep;             /* default 1 */
    int etp;            /* expert tensor parallel; default = tp */
    const char *order;  /* default "tp-cp-ep-dp-pp" */
} mc_grid_desc;

typedef struct mc_rank_coords {
    int rank;
    int tp, cp, dp, pp;         /* dense grid */
    int etp, ep, edp;           /* expert grid (pp is shared) */
} mc_rank_coords;

typedef struct mc_grid {
    mc_grid_desc desc;          /* resolved: every default filled in (desc.order stays the
                                   caller's string, or the default; see `order` below) */
    char order[MC_ORDER_MAX];   /* resolved order string, e.g. "tp-cp-ep-dp-pp"; missing size-1
                                   axes appended in Megatron's order (tp, pp, dp, ep, cp), so
                                   "tp-pp-dp" resolves to "tp-pp-dp-ep-cp" */
    int dp;                     /* world / (tp * pp * cp) */
    int edp;                    /* world / (etp * ep * pp) */
    /* Private: the two mixed-radix generators. */
    int n_axes;
    int axis_id[5];             /* order of axes, fastest first: 0 tp, 1 cp, 2 ep, 3 dp, 4 pp */
    int dense_size[5];          /* size of each axis in the dense grid, indexed like axis_id */
    int expert_size[5];         /* ... and in the expert grid */
} mc_grid;

/* Validates and resolves (grid is written only on success). Errors are MC_ERR_INVALID_DESC
   with a message naming the values and Megatron's rule, checked in Megatron's order:
   world % (tp*pp*cp), vpp > 0 needs pp > 1, world % (etp*ep*pp), the order tokens (unknown,
   repeated or empty tokens; a missing axis of size > 1), Megatron's assert that the order
   ends with pp unless PP == 1 or EDP == DP, and identical dense and expert pp groups.
   E.g. "world_size (10) is not divisible by tensor_model_parallel_size (2) x
    pipeline_model_parallel_size (4) x context_parallel_size (1) = 8". */
MC_API int mc_grid_init(mc_grid *grid, const mc_grid_desc *desc);
MC_API int mc_grid_coords(const mc_grid *grid, int rank, mc_rank_coords *out);
MC_API int mc_grid_num_groups(const mc_grid *grid, mc_group_kind kind);
MC_API int mc_grid_group_size(const mc_grid *grid, mc_group_kind kind);
/* Writes the members of group `index` (ascending in Megatron's member order) into out[cap];
   returns the member count (>= 0) or an error. out == NULL only counts; cap smaller than the
   group is MC_ERR_INVALID_ARG. */
MC_API int mc_grid_group_members(const mc_grid *grid, mc_group_kind kind, int index,
                                 int *out, int cap);
/* Which group of `kind` holds `rank`: its index and the rank's position inside it.
   Returns MC_ERR_NOT_MEMBER (and -1s) when the rank is in none (e.g. a middle pipeline
   stage and the embedding group). Either output pointer may be NULL. */
MC_API int mc_grid_group_of(const mc_grid *grid, mc_group_kind kind, int rank,
                            int *group_index, int *index_in_group);
/* Pipeline helpers (next/prev are cyclic, as in Megatron). */
MC_API int mc_grid_pipeline_ranks(const mc_grid *grid, int rank, int *first, int *last,
                                  int *next, int *prev);
MC_API const char *mc_group_kind_name(mc_group_kind kind);   /* "tp", "dp_cp", ... */
MC_API int mc_group_kind_from_name(const char *name);        /* kind, or -1 */

/* The group plan: every group of every kind, in Megatron's creation order:
   dp_cp, dp, cp, mp, tp, then for each pp group: pp, embedding, position_embedding,
   then tp_dp_cp, tp_dp, tp_cp, ep, expert_tp, tp_ep, tp_ep_pp, expert_dp. */
typedef struct mc_plan_entry {
    mc_group_kind kind;
    int index;                  /* group index within its kind */
} mc_plan_entry;
/* Returns the number of entries; writes at most cap of them (out may be NULL to count). */
MC_API int mc_grid_creation_plan(const mc_grid *grid, mc_plan_entry *out, int cap);
/* 64-bit FNV-1a over (kind, members) of every plan entry, the resolved sizes and order,
   MC_VERSION_HEX and `salt`. Equal on all ranks iff they would create the same groups. */
MC_API uint64_t mc_grid_plan_fingerprint(const mc_grid *grid, uint64_t salt);

/* ---------------------------------------------------------------------------------------------
   >>parallel_state.comm  The communicator table. Layer and lab code call the mc_* wrappers below; each
   backend fills an mc_comm_ops. Buffers are op memory of the world's table (mc_comm_memory:
   host memory for the CPU table, device memory for a CUDA table, always for `nccl`): use
   mc_comm_alloc / mc_comm_upload / mc_comm_download to stay backend-neutral.

   Backends:
     self   size 1. Collectives copy send to recv; send/recv to itself (peer 0) go through a
            FIFO queue per tag, and a receive that no send can ever match ends in
            MC_ERR_TIMEOUT at once instead of blocking.
     mpi    every operation is the nonblocking MPI call; a blocking call is start + wait, and a
            wait polls until done or until the communicator's timeout_s (MC_ERR_TIMEOUT naming
            the communicator and the operation; the communicator should then be dropped).
            MC_AVG is SUM followed by a division (integer division for integer types). bf16
            reductions return MC_ERR_UNSUPPORTED (MPI has no bf16 type); bf16 gathers,
            broadcasts and p2p move the raw 16-bit values. Counts must fit in an int. With a
            device table (ranks sharing one GPU) each call stages through host copies: the
            send side is downloaded when it starts, the result uploaded when it finishes.
     nccl   see megatron_c_cuda.cu. */

typedef enum mc_reduce_op { MC_SUM = 0, MC_MAX, MC_MIN, MC_AVG } mc_reduce_op;
typedef enum mc_comm_backend {
    MC_BACKEND_AUTO = 0,   /* nccl when built with CUDA and every rank has its own GPU, else mpi
                              when built with MPI and the world has > 1 rank, else self */
    MC_BACKEND_SELF,
    MC_BACKEND_MPI,
    MC_BACKEND_NCCL
} mc_comm_backend;

MC_API const char *mc_backend_name(mc_comm_backend backend);  /* "self", "mpi", "nccl" */

typedef struct mc_comm mc_comm;
typedef struct mc_request mc_request;   /* handle of an async operation; mc_wait frees it */

/* Every backend's request type begins with this head; an mc_request * points at it, so that
   mc_wait and mc_test find the communicator (and its ops) that started the operation. */
typedef struct mc_request_head {
    mc_comm *comm;       /* the communicator the operation runs on */
    const char *op;      /* "all_reduce", "send", ...: named in timeout messages */
    long long timeline_id;   /* its ASYNC event (>>core.timeline), -1; set by the generic layer */
} mc_request_head;

typedef struct mc_p2p_op {
    int is_send;         /* 1 send, 0 receive */
    void *buf;
    size_t count;
    mc_dtype dtype;
    int peer;            /* rank in the communicator */
    int tag;
} mc_p2p_op;

/* The table a backend fills. `req` NULL means blocking; otherwise the call starts the
   operation and stores a handle in *req. Counts are elements. */
typedef struct mc_comm_ops {
    const char *name;
    int (*all_reduce)(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt,
                      mc_reduce_op op, mc_request **req);
    /* recv holds size * count elements, rank order */
    int (*all_gather)(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt,
                      mc_request **req);
    /* send holds size * recv_count elements; rank r receives chunk r, reduced */
    int (*reduce_scatter)(mc_comm *c, const void *send, void *recv, size_t recv_count,
                          mc_dtype dt, mc_reduce_op op, mc_request **req);
    int (*broadcast)(mc_comm *c, void *buf, size_t count, mc_dtype dt, int root,
                     mc_request **req);
    int (*send)(mc_comm *c, const void *buf, size_t count, mc_dtype dt, int peer, int tag,
                mc_request **req);
    int (*recv)(mc_comm *c, void *buf, size_t count, mc_dtype dt, int peer, int tag,
                mc_request **req);
    int (*batch_send_recv)(mc_comm *c, const mc_p2p_op *ops, int n_ops, mc_request **req);
    int (*barrier)(mc_comm *c, mc_request **req);
    /* wait up to timeout_s (<= 0: forever); frees the request on success or error */
    int (*wait)(mc_request *req, double timeout_s);
    int (*test)(mc_request *req, int *done);
    /* Make the child communicator over `members` (ranks of c, ascending member order).
       Called only on member ranks, after the generic layer has agreed on the call. */
    int (*create_child)(mc_comm *c, const int *members, int n_members, int seq,
                        mc_comm **out);
    /* Releases the backend's own state (impl). mc_comm_destroy then frees `mpi`
       (MPI_Comm_free + mc_free), `world_ranks` and the mc_comm itself. */
    void (*destroy)(mc_comm *c);
    /* Completion markers for the timeline (>>core.timeline), optional (NULL for self and mpi,
       whose blocking calls have finished when they return): the same contract as
       mc_ops.mark_record / mark_time / mark_release, on the communicator's own stream (nccl:
       a timing event recorded there right after the operation, asynchronous ones included). */
    int (*mark_record)(mc_comm *c, void **mark);
    int (*mark_time)(mc_comm *c, void *mark, double *t);
    void (*mark_release)(mc_comm *c, void *mark);
} mc_comm_ops;

struct mc_comm {
    const mc_comm_ops *ops;
    mc_comm_backend backend;
    int rank;                /* rank in this communicator */
    int size;
    int *world_ranks;        /* (size) world rank of each member */
    int world_rank;
    double timeout_s;        /* collectives and creation give MC_ERR_TIMEOUT after this */
    int create_seq;          /* collective creations made over this communicator so far */
    char name[48];           /* e.g. "world", "tp[2]" */
    const char *backend_reason;  /* world only: why mc_comm_init_world chose this backend
                                    (static text, e.g. "a single rank: using self") */
    int owns_mpi_init;       /* world only: MPI_Finalize on destroy */
    void *mpi;               /* MPI_Comm * (mpi and nccl backends), else NULL; allocated with
                                mc_malloc, freed by mc_comm_destroy */
    void *impl;              /* backend state */
    const struct mc_ops *mem;/* the memory owner: the op table whose memory the collectives
                                read and write (mc_comm_memory); children inherit it */
    int owns_mem;            /* nccl world only: the CUDA table was made for it */
    unsigned long long n_calls;   /* operations started on it (watchdog messages number them) */
    void *watchdog;          /* private: the world's progress watchdog (mpi), shared by every
                                group made from the world; NULL without one */
    int mc__host_buffers;    /* private: 1 while mc_host_collective runs an mpi collective on
                                host buffers, so a device table's staging is skipped */
};

typedef struct mc_comm_desc {
    mc_comm_backend backend;  /* default MC_BACKEND_AUTO */
    double timeout_s;         /* default 30 s; inherited by groups */
    double watchdog_s;        /* 0: no watchdog. > 0: the job-wide watchdog below (mpi) */
    int *argc;                /* passed to MPI_Init when this call initialises MPI */
    char ***argv;
    /* The op table that owns the collectives' buffers (mc_comm_memory). Default: the CPU table
       for self and mpi; for nccl a CUDA table (mc_ops_cuda_init) on the rank's GPU, made for
       the world and destroyed with it. self takes any table (its collectives are copies
       through the table); mpi takes any table too, and stages a device table's buffers
       through host copies (ranks that share a GPU, where NCCL cannot run: correct, two extra
       copies per call); nccl needs a CUDA table on its GPU. */
    const struct mc_ops *memory;
} mc_comm_desc;

/* The world communicator. Initialises MPI when built with MC_COMM_MPI and MPI is not yet
   initialised (and finalises it in mc_comm_destroy). Logs which backend was chosen and why.

   The watchdog (mpi worlds and their groups; Megatron's --distributed-timeout-minutes): a
   wait that has not finished after timeout_s minus a grace period (a tenth of it, between
   0.5 s and 10 s) asks every other rank of the world, over a private duplicate of the world
   communicator, what it is doing. Ranks answer from inside their own waits and whenever
   they start an operation. After the grace period the asking rank decides, and sends its
   verdict to every rank, whose waits then end at once with the same MC_ERR_TIMEOUT message:
     "watchdog: rank 3 made no progress: it did not answer within 1.0 s (stopped, or busy
      outside megatron_c); rank 0 waited 9.0 s in all_reduce #57 on tp[0] (world ranks
      [0,1,2,3]) | rank 1: waiting 8.9 s in all_reduce #57 on tp[0] | rank 2: ..."
   or, when every rank answers (they wait in calls that do not match: a deadlock),
     "watchdog: no rank answered with progress for 9.0 s: every rank is waiting: ...".
   After a verdict the job cannot recover: every later wait on any communicator fails at
   once with the verdict, mc_comm_destroy skips MPI_Comm_free and MPI_Finalize (which
   would wait for the stuck rank), and the program should exit non-zero (mpirun then ends
   the stuck rank) or call mc_comm_abort. Member-local creation (MPI_Comm_create_group) is
   not covered. */
MC_API int mc_comm_init_world(mc_comm **world, const mc_comm_desc *desc);
/* Ends every rank of the job at once (MPI_Abort on an MPI build; the one exit path of the
   library, taken only when the program asks). Without MPI it returns MC_ERR_UNSUPPORTED. */
MC_API int mc_comm_abort(mc_comm *world, int exit_code);
/* The watchdog's verdict once one was reached on this rank (the job is then broken), else
   NULL. */
MC_API const char *mc_comm_watchdog_verdict(const mc_comm *c);

/* Configuration agreement: the first collective a program should make, right after
   mc_comm_init_world, so that ranks started with different arguments stop before any
   collective whose count or size depends on them. Every rank passes the same list of
   (name, value) items in the same order; values are compared as text. Safe for any input:
   it first all-gathers a fixed-size summary (item count and hashes), and only when that
   differs a fixed-size hash per item and then the first differing item's value (cut to
   80 bytes), so every rank takes the same steps. On disagreement every rank returns
   MC_ERR_INVALID_DESC with the same message naming the first differing item:
     "configuration differs between ranks: --num-layers is \"4\" on rank 2 (ranks 2, 3)
      but \"2\" on rank 0 (ranks 0, 1)". Bounded by c's timeout. */
typedef struct mc_agree_item {
    const char *name;    /* e.g. "--num-layers" */
    const char *value;   /* e.g. "4" (NULL reads as "") */
} mc_agree_item;
MC_API int mc_comm_agree(mc_comm *c, const mc_agree_item *items, int n_items);
MC_API void mc_comm_destroy(mc_comm *comm);

/* What this process runs on, for logs and results (lab12's capability probe, every lab's
   envelope). Strings are "" where a part is absent or unknown; nothing here communicates.
   The CUDA part (GPU count and model, runtime, driver and NCCL versions) is filled only in a
   build with MC_ENABLE_CUDA; on a machine without a GPU it reports gpu_count 0. */
typedef struct mc_backend_info {
    char backend[8];            /* the world's backend: "self", "mpi" or "nccl" */
    char backend_reason[128];   /* why mc_comm_init_world chose it */
    int world_size;
    char device_kind[8];        /* where the world's buffers live: "cuda" (nccl, or a CUDA
                                   table given to mpi / self) or "cpu" */
    char device_name[128];      /* gpu_name for "cuda", else cpu_name */
    int device_count;           /* gpu_count for "cuda", else cpu_count */
    char cpu_name[128];         /* "model name" of /proc/cpuinfo where readable */
    int cpu_count;              /* processors listed there, 0 when unknown */
    int cuda_built;             /* 1: built with MC_ENABLE_CUDA */
    int gpu_count;              /* CUDA devices visible to this process */
    char gpu_name[128];         /* model of the current device, e.g. "NVIDIA H200" */
    char cuda_runtime[16];      /* "13.0" */
    char cuda_driver[16];       /* highest CUDA version the driver supports, "13.0" */
    char nccl_version[16];      /* the linked NCCL, "2.28.3" */
    char mpi_version[16];       /* MPI standard of the library, "3.1" */
    char mpi_library[256];      /* first line of MPI_Get_library_version */
} mc_backend_info;

/* Fills *out (zeroed first) for `world` (may be NULL: then backend and world_size stay empty). */
MC_API int mc_backend_query(const mc_comm *world, mc_backend_info *out);

/* Group creation, two ways.
   Collective: every rank of `parent` calls it, for every group, in the same order; `members`
   (ranks of parent, >= 1, no duplicates) must be identical on every caller. The call first
   exchanges a hash of the member list over the parent (with the parent's timeout):
   callers that disagree get MC_ERR_PLAN_MISMATCH naming both lists, a caller missing
   gives MC_ERR_TIMEOUT. Non-members receive *out = NULL and MC_OK.
   `verify` = 0 skips the hash comparison and pairs callers by position, as
   torch.distributed.new_group does: every member at the same call index joins one
   communicator, whatever list it passed (this is how the "only members create the group"
   bug produces wrong membership). Only lab experiments should pass 0. */
MC_API int mc_comm_create_group(mc_comm *parent, const int *members, int n_members,
                                mc_comm **out);
MC_API int mc_comm_create_group_ex(mc_comm *parent, const int *members, int n_members,
                                   int verify, mc_comm **out);
/* Member-local: only the members call it (the analogue of use_local_synchronization=True).
   `tag` must be the same on all members and unique among concurrent creations (collective
   creations use their sequence number as the tag). A non-member gets MC_ERR_NOT_MEMBER. On the
   mpi backend this is MPI_Comm_create_group, which has no timeout: a member that never calls
   blocks the others.
   Children of either kind are named "<parent>/#<seq>" or "<parent>/local<tag>" (rename them
   freely), inherit the parent's timeout and get world_ranks filled from the parent. */
MC_API int mc_comm_create_group_local(mc_comm *parent, const int *members, int n_members,
                                      int tag, mc_comm **out);

/* Blocking collectives. */
MC_API int mc_all_reduce(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt,
                         mc_reduce_op op);
MC_API int mc_all_gather(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt);
MC_API int mc_reduce_scatter(mc_comm *c, const void *send, void *recv, size_t recv_count,
                             mc_dtype dt, mc_reduce_op op);
MC_API int mc_broadcast(mc_comm *c, void *buf, size_t count, mc_dtype dt, int root);
MC_API int mc_send(mc_comm *c, const void *buf, size_t count, mc_dtype dt, int peer, int tag);
MC_API int mc_recv(mc_comm *c, void *buf, size_t count, mc_dtype dt, int peer, int tag);
MC_API int mc_batch_send_recv(mc_comm *c, const mc_p2p_op *ops, int n_ops);
MC_API int mc_barrier(mc_comm *c);
/* Async forms: start and return a handle; mc_wait finishes it (with the comm's timeout). */
MC_API int mc_all_reduce_async(mc_comm *c, const void *send, void *recv, size_t count,
                               mc_dtype dt, mc_reduce_op op, mc_request **req);
MC_API int mc_all_gather_async(mc_comm *c, const void *send, void *recv, size_t count,
                               mc_dtype dt, mc_request **req);
MC_API int mc_reduce_scatter_async(mc_comm *c, const void *send, void *recv, size_t recv_count,
                                   mc_dtype dt, mc_reduce_op op, mc_request **req);
MC_API int mc_broadcast_async(mc_comm *c, void *buf, size_t count, mc_dtype dt, int root,
                              mc_request **req);
MC_API int mc_send_async(mc_comm *c, const void *buf, size_t count, mc_dtype dt, int peer,
                         int tag, mc_request **req);
MC_API int mc_recv_async(mc_comm *c, void *buf, size_t count, mc_dtype dt, int peer, int tag,
                         mc_request **req);
MC_API int mc_batch_send_recv_async(mc_comm *c, const mc_p2p_op *ops, int n_ops,
                                    mc_request **req);
MC_API int mc_barrier_async(mc_comm *c, mc_request **req);
MC_API int mc_wait(mc_request *req);
/* *done = 1: the operation finished (or failed, see the status) and req has been freed. */
MC_API int mc_test(mc_request *req, int *done);
/* The communicator's memory owner (mc_comm_desc.memory): every buffer of a collective is
   memory of this table. The four helpers below go through it (device memory for nccl). */
MC_API const struct mc_ops *mc_comm_memory(const mc_comm *c);
MC_API void *mc_comm_alloc(mc_comm *c, size_t bytes);
MC_API void mc_comm_free(mc_comm *c, void *ptr);
MC_API int mc_comm_upload(mc_comm *c, void *dst, const void *host_src, size_t bytes);
MC_API int mc_comm_download(mc_comm *c, void *host_dst, const void *src, size_t bytes);

/* A blocking collective on HOST values, whatever memory the communicator works on: send and
   recv are host buffers; the values travel through buffers of the communicator's memory owner
   (device memory on nccl) and back, or directly when that memory is the host's. The one way
   for token counts, loss sums and flags to cross ranks. On mpi the host buffers go to MPI as
   they are, whatever the memory owner (no staging copies).
     MC_COLL_ALL_REDUCE  recv[count] = op over ranks of send[count] (send may equal recv)
     MC_COLL_ALL_GATHER  recv[size * count] = every rank's send[count], rank order
     MC_COLL_BROADCAST   recv[count] = root's send[count] (send may equal recv; on other ranks
                         send is not read and may be NULL)
   op is read by the all-reduce only, root by the broadcast only. After a timeout the staging
   buffers are leaked on purpose (the backend may still write them). */
typedef enum mc_collective {
    MC_COLL_ALL_REDUCE = 0, MC_COLL_ALL_GATHER, MC_COLL_BROADCAST
} mc_collective;
MC_API int mc_host_collective(mc_comm *c, mc_collective kind, const void *send, void *recv,
                              size_t count, mc_dtype dt, mc_reduce_op op, int root);

#if defined(MC_ENABLE_CUDA)
/* Implemented in megatron_c_cuda.cu. */
MC_CUDA_API int mc__nccl_available(int local_rank, int local_size);  /* 1 if every local rank has a GPU */
/* Turns an MPI world into NCCL; memory: the CUDA table for its buffers, or NULL to make one on
   the rank's GPU (owned by the world). */
MC_CUDA_API int mc__nccl_init_world(mc_comm *world_mpi_filled, const struct mc_ops *memory);
MC_CUDA_API void mc__cuda_backend_info(mc_backend_info *out);        /* the CUDA fields of the query */
MC_CUDA_API const mc_comm_ops *mc__nccl_ops(void);
/* Implemented by the header: lets the companion file report through mc_last_error() and the
   logger (level 1). Returns `status`. */
MC_API int mc__set_error(int status, const char *fmt, ...);
#endif

/* ---------------------------------------------------------------------------------------------
   >>parallel_state  Megatron's initialize_model_parallel. */

typedef struct mc_parallel_desc {
    mc_comm *world;       /* required */
    mc_grid_desc grid;    /* grid.world defaults to world->size and must equal it */
    uint64_t plan_salt;   /* mixed into the plan fingerprint; ranks built differently differ */
    int skip_plan_check;  /* 1: do not exchange the fingerprint (only for experiments) */
} mc_parallel_desc;

/* Output of mc_parallel_init, which never reads it: a fresh, reused or garbage-filled struct
   all work. Destroy a live state before initialising it again (init would forget its
   communicators). */
typedef struct mc_parallel_state {
    int initialized;
    mc_grid grid;
    mc_comm *world;
    mc_rank_coords coords;                   /* of this rank */
    mc_comm *group[MC_GROUP_COUNT];          /* NULL where this rank is in no group of a kind */
    int group_index[MC_GROUP_COUNT];         /* -1 where none */
    uint64_t plan_fingerprint;
    int n_created;                           /* collective creations made, in plan order */
    int vp_stage;                            /* current virtual stage (0 unless interleaved);
                                                the caller sets it while running a chunk */
} mc_parallel_state;

/* Exchanges the plan fingerprint over the world (a mismatch fails on every rank within the
   world's timeout, with a message naming the first differing group), then creates every
   group of every kind in plan order, collectively, keeping the ones this rank belongs to
   (named e.g. "tp[2]"). Works on a `self` world of size 1. *ps is output only: it is zeroed
   first, whatever it held, and stays zeroed (initialized == 0) when init fails.
   Stage predicates follow Megatron: with vpp > 0 and ignore_virtual = 0, the first stage also
   needs vp_stage == 0 and the last stage vp_stage == vpp - 1; the first and last members of
   the embedding group count only on those stages, other members always. */
MC_API int mc_parallel_init(mc_parallel_state *ps, const mc_parallel_desc *desc);
MC_API int mc_parallel_destroy(mc_parallel_state *ps);
MC_API mc_comm *mc_parallel_group(const mc_parallel_state *ps, mc_group_kind kind);
MC_API int mc_parallel_rank(const mc_parallel_state *ps, mc_group_kind kind);  /* -1 if none */
MC_API int mc_parallel_size(const mc_parallel_state *ps, mc_group_kind kind);  /* 0 if none */
MC_API int mc_parallel_is_first_stage(const mc_parallel_state *ps, int ignore_virtual);
MC_API int mc_parallel_is_last_stage(const mc_parallel_state *ps, int ignore_virtual);
MC_API int mc_parallel_in_embedding_group(const mc_parallel_state *ps, int ignore_virtual);
/* World rank of the first member of the group of `kind` (Megatron's *_src_rank). */
MC_API int mc_parallel_src_rank(const mc_parallel_state *ps, mc_group_kind kind);

/* Exchanges a fingerprint and a describable plan over `world`; on disagreement returns
   MC_ERR_PLAN_MISMATCH on every rank with a message such as
   "group plan differs: rank 3 creates #12 pp[1] = [1,5] but rank 0 creates #12 pp[1] = [1,3]
    (rank 3: tp=2 pp=2 cp=1 ep=1 order=tp-pp-dp; rank 0: ... order=tp-cp-ep-dp-pp)".
   Used by mc_parallel_init; exposed for tests and labs. */
MC_API int mc_parallel_check_plan(mc_comm *world, const mc_grid *grid, uint64_t salt);

/* =============================================================================================
   tensor_parallel: mappings, layers, cross entropy, random */

/* @tensor_parallel:declarations begin */
/* ---------------------------------------------------------------------------------------------
   >>tensor_parallel  Megatron's tensor-parallel mappings and layers (megatron_semantics.md
   §2-§5): the communication of a layer is written out in the layer function.

   Activations are [S, B, C] row-major: the "first dim" is the sequence S (the sequence-parallel
   split), the "last dim" is C (the tensor-parallel split of hidden, ffn and vocab columns).
   Every function takes GLOBAL sizes (the full S, C, OC, V) and derives the local ones from the
   tp communicator: TP = tp->size, r = tp->rank. tp == NULL or a communicator of size 1 is
   TP = 1: every mapping is then the identity (a copy, none when out == inp).
   Argument order (llm.c): outputs, caches and scratch, inputs, weights, sizes, flags, the
   dtype, tp, ops. Tensors are op memory of `ops` (host memory for mc_ops_cpu(), device memory
   for CUDA), and the communicator must work on that memory (mc_comm_memory). Activations,
   weights and the logits are `dt` elements (MC_F32, or MC_BF16 under --bf16); weight and
   bias gradients (float *) and the cross-entropy statistics are always fp32. Outputs must not
   overlap inputs, except that copy_to and reduce_from (both directions) also work in place
   (out == inp). Split and gather of a last dimension are strided copies (ops->copy_2d), one
   per shard, never a copy per row.
   Scratch: a buffer of at least the documented number of dt elements (fp32 floats for the
   cross entropy), or NULL to have the call allocate (and free) one through ops->alloc.
   Errors: MC_ERR_INVALID_ARG with Megatron's divisibility messages, e.g.
     "scatter_to_tensor_model_parallel_region: last dimension (6) is not divisible by
      tensor_model_parallel_size (4) (Megatron's divide: 6 is not divisible by 4)"
     "gather_from_sequence_parallel_region: first dimension of the tensor (S = 6) should be
      divisible by tensor parallel size (4)"
   and the communicator's MC_ERR_COMM / MC_ERR_TIMEOUT (the outputs are then undefined).

   The mappings (§2). R = elements per sequence position (B * C); D = the full last dim.
     mapping                              forward                backward
     copy_to_tp_region          [n]       identity               all-reduce SUM
     reduce_from_tp_region      [n]       all-reduce SUM         identity
     scatter_to_tp_region       [N, D]    split last dim         all-gather last dim
     gather_from_tp_region      [N, D/TP] all-gather last dim    split last dim
     scatter_to_sp_region       [S, R]    split first dim        all-gather first dim
     gather_from_sp_region      [S/TP, R] all-gather first dim   reduce-scatter first dim, or
                                                                 split with tp_output_grad = 0
     reduce_scatter_to_sp_region [S, R]   reduce-scatter first   all-gather first dim
     all_gather_last_dim        [N, D/TP] all-gather last dim    reduce-scatter last dim
     reduce_scatter_last_dim    [N, D]    reduce-scatter last    all-gather last dim
   A first-dim shard is contiguous ([S/TP, R] rows r*S/TP ..), so those are single collectives.
   A last-dim gather all-gathers the [N, D/TP] shards into scratch [TP, N, D/TP] and re-chunks
   them into [N, D]; a last-dim reduce-scatter stacks the TP column slices of [N, D] into
   scratch [TP, N, D/TP] and reduce-scatters that (both as Megatron does). Their scratch: N * D
   elements. */
MC_API int mc_copy_to_tp_region_forward(void *out, const void *inp, size_t n, mc_dtype dt,
                                        mc_comm *tp, const mc_ops *ops);
MC_API int mc_copy_to_tp_region_backward(void *dinp, const void *dout, size_t n, mc_dtype dt,
                                         mc_comm *tp, const mc_ops *ops);
MC_API int mc_reduce_from_tp_region_forward(void *out, const void *inp, size_t n, mc_dtype dt,
                                            mc_comm *tp, const mc_ops *ops);
MC_API int mc_reduce_from_tp_region_backward(void *dinp, const void *dout, size_t n, mc_dtype dt,
                                             mc_comm *tp, const mc_ops *ops);
/* out [N, D/TP] = this rank's columns of inp [N, D] */
MC_API int mc_scatter_to_tp_region_forward(void *out, const void *inp, int N, int D, mc_dtype dt,
                                           mc_comm *tp, const mc_ops *ops);
/* dinp [N, D] = all-gather of dout [N, D/TP] */
MC_API int mc_scatter_to_tp_region_backward(void *dinp, void *scratch, const void *dout, int N,
                                            int D, mc_dtype dt, mc_comm *tp, const mc_ops *ops);
MC_API int mc_gather_from_tp_region_forward(void *out, void *scratch, const void *inp, int N, int D,
                                            mc_dtype dt, mc_comm *tp, const mc_ops *ops);
MC_API int mc_gather_from_tp_region_backward(void *dinp, const void *dout, int N, int D,
                                             mc_dtype dt, mc_comm *tp, const mc_ops *ops);
/* out [S/TP, R] = rows r*S/TP .. of inp [S, R] */
MC_API int mc_scatter_to_sp_region_forward(void *out, const void *inp, int S, size_t R, mc_dtype dt,
                                           mc_comm *tp, const mc_ops *ops);
MC_API int mc_scatter_to_sp_region_backward(void *dinp, const void *dout, int S, size_t R,
                                            mc_dtype dt, mc_comm *tp, const mc_ops *ops);
MC_API int mc_gather_from_sp_region_forward(void *out, const void *inp, int S, size_t R,
                                            mc_dtype dt, mc_comm *tp, const mc_ops *ops);
/* tensor_parallel_output_grad = 1 (Megatron's default): dout [S, R] holds partial sums (the
   next layer is tensor-parallel), so it is reduce-scattered; 0: dout is already complete and
   replicated, so this rank's rows are only cut out. */
MC_API int mc_gather_from_sp_region_backward(void *dinp, const void *dout, int S, size_t R,
                                             int tensor_parallel_output_grad, mc_dtype dt,
                                             mc_comm *tp, const mc_ops *ops);
MC_API int mc_reduce_scatter_to_sp_region_forward(void *out, const void *inp, int S, size_t R,
                                                  mc_dtype dt, mc_comm *tp, const mc_ops *ops);
MC_API int mc_reduce_scatter_to_sp_region_backward(void *dinp, const void *dout, int S, size_t R,
                                                   mc_dtype dt, mc_comm *tp, const mc_ops *ops);
MC_API int mc_all_gather_last_dim_forward(void *out, void *scratch, const void *inp, int N, int D,
                                          mc_dtype dt, mc_comm *tp, const mc_ops *ops);
MC_API int mc_all_gather_last_dim_backward(void *dinp, void *scratch, const void *dout, int N,
                                           int D, mc_dtype dt, mc_comm *tp, const mc_ops *ops);
MC_API int mc_reduce_scatter_last_dim_forward(void *out, void *scratch, const void *inp, int N,
                                              int D, mc_dtype dt, mc_comm *tp, const mc_ops *ops);
MC_API int mc_reduce_scatter_last_dim_backward(void *dinp, void *scratch, const void *dout, int N,
                                               int D, mc_dtype dt, mc_comm *tp, const mc_ops *ops);

/* Column / Row parallel linear (§3). flags is an OR of: */
typedef enum mc_tp_flag {
    MC_TP_SEQUENCE_PARALLEL = 1,   /* activations outside the layer are [S/TP, B, C] */
    MC_TP_GATHER_OUTPUT = 2,       /* column: all-gather the output to [S, B, OC] (not with SP) */
    MC_TP_INPUT_IS_PARALLEL = 4,   /* row: the input is already [S, B, C/TP] (SP requires it) */
    MC_TP_SKIP_BIAS_ADD = 8        /* leave the bias to the caller (e.g. a fused bias-dropout-add):
                                      the layer neither adds it nor computes its gradient */
} mc_tp_flag;
/* MC_TP_SEQUENCE_PARALLEL with TP = 1 is ignored, as Megatron's layers disable SP for
   themselves when the group has one rank (the config validator refuses it earlier). */

/* ColumnParallelLinear(C -> OC), Y = X A^T + b split by output rows: weight [OC/TP, C] (rows
   r*OC/TP .., partition dim 0), bias [OC/TP] or NULL; OC % TP == 0.
     inp  [S, B, C] replicated, or [S/TP, B, C] under SP (all-gathered along S here)
     out  [S, B, OC/TP], or [S, B, OC] with MC_TP_GATHER_OUTPUT (the bias is added before the
          gather). SP together with MC_TP_GATHER_OUTPUT is an error (Megatron asserts). */
MC_API int mc_column_parallel_linear_forward(void *out, void *scratch, const void *inp,
                                             const void *weight, const void *bias, int S, int B,
                                             int C, int OC, int flags, mc_dtype dt, mc_comm *tp,
                                             const mc_ops *ops);
/* dinp [shape of inp] (=), dweight [OC/TP, C] (+=), dbias [OC/TP] (+=, may be NULL);
   dout [shape of out]; inp and weight as in the forward. With MC_TP_GATHER_OUTPUT dout is first
   split to this rank's columns. Then
     no SP, TP > 1: dX = dY A is all-reduced over TP asynchronously while dA += dY^T X runs
                    (Megatron's allreduce_dgrad);
     SP:            the input is all-gathered AGAIN (it is not kept from the forward) while
                    dX = dY A runs; dX [S, B, C] is then reduce-scattered along S asynchronously
                    while dA += dY^T X runs. */
MC_API int mc_column_parallel_linear_backward(void *dinp, float *dweight, float *dbias,
                                              void *scratch, const void *dout, const void *inp,
                                              const void *weight, int S, int B, int C, int OC,
                                              int flags, mc_dtype dt, mc_comm *tp,
                                              const mc_ops *ops);
/* The same followed by GELU (Megatron's MLP: fc1 -> activation, its bias-GELU fusion): pre
   [shape of out] (=) receives X A^T + b, out (=) gelu(pre), from one ops->gemm_gelu_forward
   (cuBLASLt's epilogue on CUDA). Not with MC_TP_GATHER_OUTPUT or MC_TP_SKIP_BIAS_ADD; the
   backward is mc_column_parallel_linear_backward with dout = the gradient of pre (see
   mc_row_parallel_linear_gelu_backward). */
MC_API int mc_column_parallel_linear_gelu_forward(void *out, void *pre, void *scratch,
                                                  const void *inp, const void *weight,
                                                  const void *bias, int S, int B, int C, int OC,
                                                  int flags, mc_dtype dt, mc_comm *tp,
                                                  const mc_ops *ops);
/* Floats of scratch that both passes of the layer need (0 when none). */
MC_API size_t mc_column_parallel_linear_scratch(int S, int B, int C, int OC, int flags,
                                                int tp_size);

/* RowParallelLinear(C -> OC), Y = sum_r X_r A_r^T + b split by input columns: weight
   [OC, C/TP] (columns r*C/TP .., partition dim 1), bias [OC] (not split) or NULL; C % TP == 0.
     inp  [S, B, C/TP] with MC_TP_INPUT_IS_PARALLEL, else [S, B, C] (split here; not allowed
          under SP: "To enable sequence_parallel, input_is_parallel must be true")
     out  [S, B, OC] all-reduced over TP, or [S/TP, B, OC] reduce-scattered along S under SP.
   The bias is added once, after the reduction (it is replicated; under SP its gradient is
   partial per rank: mark it sequence_parallel so that finalize all-reduces it over TP). */
MC_API int mc_row_parallel_linear_forward(void *out, void *scratch, const void *inp,
                                          const void *weight, const void *bias, int S, int B,
                                          int C, int OC, int flags, mc_dtype dt, mc_comm *tp,
                                          const mc_ops *ops);
/* dinp [shape of inp] (=), dweight [OC, C/TP] (+=), dbias [OC] (+=, may be NULL); dout [shape
   of out]. Under SP dout is all-gathered along S first; without MC_TP_INPUT_IS_PARALLEL the
   local dX is all-gathered along the last dim (asynchronously, while dA runs) into [S, B, C]. */
MC_API int mc_row_parallel_linear_backward(void *dinp, float *dweight, float *dbias,
                                           void *scratch, const void *dout, const void *inp,
                                           const void *weight, int S, int B, int C, int OC,
                                           int flags, mc_dtype dt, mc_comm *tp,
                                           const mc_ops *ops);
/* The backward of a row-parallel layer whose input was gelu(pre) (the MLP's fc2): dpre [shape
   of inp] (=) = gelu'(pre) * dX from one ops->gemm_gelu_backward (the GELU's backward in the
   dgrad GEMM's epilogue on CUDA); dweight, dbias as above. Needs MC_TP_INPUT_IS_PARALLEL. */
MC_API int mc_row_parallel_linear_gelu_backward(void *dpre, float *dweight, float *dbias,
                                                void *scratch, const void *dout, const void *inp,
                                                const void *pre, const void *weight, int S,
                                                int B, int C, int OC, int flags, mc_dtype dt,
                                                mc_comm *tp, const mc_ops *ops);
MC_API size_t mc_row_parallel_linear_scratch(int S, int B, int C, int OC, int flags,
                                             int tp_size);

/* Megatron's VocabUtility: rank r of TP owns vocab ids [*start, *end) = [r V/TP, (r+1) V/TP).
   V % TP != 0 is MC_ERR_INVALID_ARG. */
MC_API int mc_vocab_range(int V, int tp_rank, int tp_size, int *start, int *end);

/* VocabParallelEmbedding (§4): table [V/TP, C] holds this rank's vocab rows (V: the padded
   vocabulary, mc_gpt_padded_vocab_size()). out [N, C] (=): each rank looks up the ids it owns and writes zero rows for the
   others, then the rows are all-reduced over TP, so every rank holds the full lookup.
   (Megatron reduce-scatters along S instead when SP is on and there is no learned position
   embedding; the GPT here has position embeddings, so the model scatters to SP after adding
   them.) ids [N] outside [0, V) are an error, checked by ops->check_ids (the CPU table reads
   them; CUDA checks only with MC_CUDA_SYNC_CHECK=1). */
MC_API int mc_vocab_parallel_embedding_forward(void *out, const int *ids, const void *table,
                                               int N, int C, int V, mc_dtype dt, mc_comm *tp,
                                               const mc_ops *ops);
/* dtable [V/TP, C] (+=) gets the rows of dout [N, C] whose ids this rank owns; no
   communication (the all-reduce's backward is the identity). */
MC_API int mc_vocab_parallel_embedding_backward(float *dtable, const void *dout, const int *ids,
                                                int N, int C, int V, mc_dtype dt, mc_comm *tp,
                                                const mc_ops *ops);

/* Vocab-parallel cross entropy (§5) on logits [N, V/TP] (this rank's columns of the padded
   vocabulary V) and targets [N] in [0, V). losses [N] (=) per token; max [N] and sum_exp [N]
   are the caches for backward: the global row maximum and the global sum of exp(logit - max).
   Exactly three all-reduces over TP and never the full logits:
     1. MAX of the local row maxima;
     2. SUM of the target logit (nonzero only on the rank that owns the target column);
     3. SUM of the local sums of exp(logit - max).
   loss = log(sum_exp) + max - target_logit.
   Label smoothing a = label_smoothing in [0, 1): the target distribution puts 1 - a on the
   target and a / (K - 1) on each other entry of the K = V (global) entries. With
   s = a K / (K - 1):
       loss = (1 - s) (log(sum_exp) + max - target_logit) - s mean_j log p_j,
       mean_j log p_j = (sum over the GLOBAL vocabulary of logit_j) / K - max - log(sum_exp).
   The local sums of logits ride in all-reduce 3 (packed after the sums of exp), so smoothing
   still costs three all-reduces. This differs from Megatron (open issues #737 and #7464), which
   takes K = the LOCAL partition size and the mean over the LOCAL partition: there the smoothed
   loss changes with TP and differs between TP ranks; here it is the TP = 1 loss on every rank.
   Scratch: mc_vocab_parallel_cross_entropy_scratch() floats, or NULL.
   The per-token combination (a log per token) is an op (cross_entropy_loss), and so is the
   loss sum: loss_sum (one fp64 value in op memory, may be NULL) = the sum of the N losses.
   Nothing is read back to the host. */
MC_API int mc_vocab_parallel_cross_entropy_forward(float *losses, double *loss_sum, float *max,
                                                   float *sum_exp, float *scratch,
                                                   const void *logits, const int *targets, int N,
                                                   int V, float label_smoothing, mc_dtype dt,
                                                   mc_comm *tp, const mc_ops *ops);
/* dlogits [N, V/TP] (=) = (softmax - (1 - s) onehot(target) - s / K) * dlosses[row], with
   softmax = exp(logit - max) / sum_exp; no communication. It calls
   ops->cross_entropy_backward(dlogits, logits, max, sum_exp, targets, dlosses, N, V/TP,
   r*V/TP, s, V): the op takes s = a K / (K - 1) (not Megatron's a) and the GLOBAL K = V, and
   puts the -(1 - s) only at the target column of the rank that owns it. */
MC_API int mc_vocab_parallel_cross_entropy_backward(void *dlogits, const float *dlosses,
                                                    const void *logits, const float *max,
                                                    const float *sum_exp, const int *targets,
                                                    int N, int V, float label_smoothing,
                                                    mc_dtype dt, mc_comm *tp,
                                                    const mc_ops *ops);
MC_API size_t mc_vocab_parallel_cross_entropy_scratch(int N, int V, float label_smoothing,
                                                      int tp_size);

/* CPU initialisation (§3.1): mc_init_normal_shard, declared in >>core.params, is implemented here.
   Element g = i * cols + j of the GLOBAL master of parameter `name` is
       key = FNV-1a 64 over the bytes of name, continued over the 8 little-endian bytes of seed
       x   = Philox4x32-10(counter = (g low, g high, 0, 0), key = (key low, key high))
       u1  = (x[0] + 1) / 2^32 in (0, 1],  u2 = x[1] / 2^32 in [0, 1)    (x[2], x[3] unused)
       w   = std * sqrt(-2 ln u1) * cos(2 pi u2)                        (Box-Muller, in double)
   one Philox block per element, so any element, hence any shard at any TP size and stride, is
   computed on its own: shards are TP-size invariant like Megatron's CPU initialisation (which
   builds the whole master with torch's CPU generator and cuts it). A 1-D tensor (rows == 1)
   splits along its only dimension. Invalid sizes write nothing and set mc_last_error().

       float full[32], shard[16];
       mc_init_normal_shard(full, "decoder.layers.0.mlp.linear_fc1.weight", 8, 4, -1, 1, 0, 1,
                            0.02f, 1234);    // row 0: -0.034442 0.034814 -0.007775 -0.029111
       mc_init_normal_shard(shard, "decoder.layers.0.mlp.linear_fc1.weight", 8, 4, 0, 1, 1, 2,
                            0.02f, 1234);    // TP 2, rank 1: row 0 = global row 4 =
                                             //   -0.012309 0.016442 -0.027588 0.013217
       with stride 2 the same rank's row 0 is global row 2: -0.010136 -0.020999 0.032555 0.010440 */

/* Megatron's partition-stride rule (§3.1), shared by initialisation and checkpoint resharding:
   the index along the partition dim, in the GLOBAL tensor of `global_dim` entries, of local
   index `local_index` on tp_rank. The dim is cut into TP * stride pieces of
   global_dim / (TP * stride); rank r holds pieces r, r + TP, r + 2 TP, ... in that order.
   E.g. global_dim 8, TP 2, stride 2: rank 0 holds {0, 1, 4, 5}. Returns -1 for invalid input
   (indivisible sizes, a rank or index out of range). */
MC_API int mc_shard_global_index(int local_index, int global_dim, int stride, int tp_rank,
                                 int tp_size);

/* @tensor_parallel:declarations end */

/* ---------------------------------------------------------------------------------------------
   >>tensor_parallel.random  Philox4x32-10 streams and Megatron's model-parallel RNG tracker.

   Philox (Salmon et al., SC'11) is counter based: a block of four 32-bit outputs is a pure
   function of (key, counter), so any element of a stream can be computed on its own and the
   CPU and a GPU kernel draw the same dropout mask from the same (seed, offset).

   A stream mc_rng {seed, offset}: element i of the next draw is global index g = offset + i,
   taken from lane g % 4 of the block with key = (seed low, seed high 32 bits) and counter =
   (g / 4 low, g / 4 high, 0, 0). A draw of n elements then advances offset by n rounded up to
   a multiple of 4, so every draw starts on a fresh block (a GPU thread can own whole blocks).
   Indices are 64-bit, so a stream holds 2^64 elements (blocks below 2^62). Uniform floats use
   the top 24 bits: (bits >> 8) * 2^-24, in [0, 1).

       mc_rng rng = {1234, 0};                   // seed 1234, offset 0
       float u[3];
       mc_rng_uniform(&rng, u, 3);               // u = 0.127208 0.853469 0.265649; offset 4
       uint8_t keep[8];
       mc_rng_dropout_mask(&rng, keep, 8, 0.5f); // keep = 1 0 1 0 0 1 1 1; offset 12
       mc_rng_uniform_at(1234, 1);               // 0.853469 again, without a stream

   The tracker holds named streams next to the default generator (`current` while no stream is
   forked). Megatron's seeding on a rank with tp_rank 1, every other rank 0:

       mc_rng_tracker t = {0};
       mc_rng_tracker_seed_megatron(&t, 1234, 1, 0, 0, 0, 0, 0);
           // default-rng, data-parallel-rng: 1234   model-parallel-rng: 1234 + 2718 + 1 = 3953
           // expert-parallel-rng: 1234 + 1024 + 100 * 0 + 0 = 2258
       mc_rng_tracker_fork(&t, MC_RNG_MODEL_PARALLEL);
       mc_rng_uniform(mc_rng_tracker_current(&t), u, 2);   // u = 0.049593 0.576654
       mc_rng_tracker_unfork(&t, MC_RNG_MODEL_PARALLEL);   // default generator again */

#define MC_RNG_DEFAULT "default-rng"                 /* the generator outside any fork */
#define MC_RNG_DATA_PARALLEL "data-parallel-rng"     /* seed', same on every TP rank */
#define MC_RNG_MODEL_PARALLEL "model-parallel-rng"   /* seed' + 2718 + tp_rank */
#define MC_RNG_EXPERT_PARALLEL "expert-parallel-rng" /* seed' + 1024 + 100 * ep_rank + etp_rank */
#define MC_RNG_MAX_STREAMS 8
#define MC_RNG_NAME_MAX 32                           /* including the terminating NUL */
#define MC_RNG_MAX_FORK_DEPTH 16

/* One Philox4x32-10 block (ten rounds; the key is bumped by the Weyl constants between them). */
MC_API void mc_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

typedef struct mc_rng {
    uint64_t seed;             /* the Philox key */
    uint64_t offset;           /* index of the next element; a multiple of 4 between draws */
} mc_rng;

/* Element `index` of the stream with `seed`, as raw bits and as a uniform float in [0, 1). */
MC_API uint32_t mc_rng_bits_at(uint64_t seed, uint64_t index);
MC_API float mc_rng_uniform_at(uint64_t seed, uint64_t index);
/* Draw n elements and advance rng->offset by n rounded up to a multiple of 4. */
MC_API int mc_rng_uniform(mc_rng *rng, float *out, size_t n);
/* mask[i] = 1 (keep) when element i's uniform is >= p, else 0 (drop): each element is dropped
   with probability p. p must be in [0, 1]. */
MC_API int mc_rng_dropout_mask(mc_rng *rng, uint8_t *mask, size_t n, float p);

/* The streams of a tracker, as get_states / set_states copy them. */
typedef struct mc_rng_states {
    mc_rng current;            /* the generator draws use now (default, or the forked stream) */
    int n_streams;
    char names[MC_RNG_MAX_STREAMS][MC_RNG_NAME_MAX];
    mc_rng streams[MC_RNG_MAX_STREAMS];
} mc_rng_states;

/* Megatron's CudaRNGStatesTracker. A zeroed struct is an empty tracker whose default generator
   has seed 0. Semantics (megatron_semantics.md 6.2):
     add(name, seed)  fails if the seed was used before (since the last reset) or the name
                      exists; the stream starts at offset 0.
     fork(name)       fails for an unknown name. If a stream is active, the current generator
                      is written back to its slot first; then the named stream becomes current.
     unfork(name)     fails unless `name` is the active stream. Stores the advanced generator
                      in the name's slot and restores the outer one: the outer stream's slot,
                      or the default generator as it was at fork time.
   So nested forks behave like independent streams: fork A, fork B, fork A draws A's next
   numbers, not its first ones again. */
typedef struct mc_rng_tracker {
    mc_rng_states s;
    int n_seeds;
    uint64_t seeds[MC_RNG_MAX_STREAMS];   /* every seed added since the last reset */
    int active;                           /* 0: the default generator; k > 0: stream k - 1 */
    int depth;                            /* forks open */
    struct {
        int outer;                        /* `active` before the fork */
        mc_rng saved;                     /* the default generator, when outer == 0 */
    } stack[MC_RNG_MAX_FORK_DEPTH];
} mc_rng_tracker;

/* Forgets every stream and seed, closes every fork (the current generator is left as is). */
MC_API void mc_rng_tracker_reset(mc_rng_tracker *t);
/* Re-seeds the default generator (torch.cuda.manual_seed): current = {seed, 0}. */
MC_API void mc_rng_tracker_manual_seed(mc_rng_tracker *t, uint64_t seed);
MC_API int mc_rng_tracker_add(mc_rng_tracker *t, const char *name, uint64_t seed);
MC_API int mc_rng_tracker_fork(mc_rng_tracker *t, const char *name);
MC_API int mc_rng_tracker_unfork(mc_rng_tracker *t, const char *name);
/* The generator to draw from now (inside a fork: the forked stream). */
MC_API mc_rng *mc_rng_tracker_current(mc_rng_tracker *t);
/* MC_RNG_DEFAULT or the name of the innermost forked stream. */
MC_API const char *mc_rng_tracker_active_name(const mc_rng_tracker *t);
/* The stored state of a named stream (not advanced by draws inside an open fork of it until
   that fork is closed or another fork is opened inside it). */
MC_API int mc_rng_tracker_get(const mc_rng_tracker *t, const char *name, mc_rng *out);
/* A copy of every stream and of the current generator: what recompute saves before a
   checkpointed forward and restores before re-running it. set_states replaces them; inside a
   fork it needs the same stream names in the same order (MC_ERR_STATE otherwise). */
MC_API int mc_rng_tracker_get_states(const mc_rng_tracker *t, mc_rng_states *out);
MC_API int mc_rng_tracker_set_states(mc_rng_tracker *t, const mc_rng_states *states);
/* Megatron's _set_random_seed + model_parallel_cuda_manual_seed: seed must be > 0;
   seed' = seed + 100 * pp_rank (+ 10 * dp_rank with data_parallel_random_init). Resets the
   tracker, seeds the default generator with seed' and adds data-parallel-rng (seed'),
   model-parallel-rng (seed' + 2718 + tp_rank) and expert-parallel-rng
   (seed' + 1024 + 100 * ep_rank + etp_rank). */
MC_API int mc_rng_tracker_seed_megatron(mc_rng_tracker *t, long long seed, int tp_rank,
                                        int pp_rank, int ep_rank, int etp_rank, int dp_rank,
                                        int data_parallel_random_init);

/* =============================================================================================
   pipeline_parallel: schedule tables and the schedules that run them */

/* ---------------------------------------------------------------------------------------------
   >>pipeline_parallel.schedule_table  Which forward (F) and backward (B) each pipeline stage runs, in order:
   Megatron's three schedules reduced to their op order, with no compute and no communication.

     no pipelining   pp == 1:  F0 B0 F1 B1 ...
     1F1B            pp > 1:   warmup w = min(pp - r - 1, M) forwards, then M - w pairs
                               "F(w + i) B(i)", then the w remaining backwards.
     interleaved     pp > 1, vpp >= 2 chunks per stage, group size N (default pp):
                     virtual micro-batch k = 0 .. M*V-1 maps to (micro-batch, chunk) through a
                     table built group by group: for each group of N micro-batches (the last
                     one holds what remains), chunk 0 runs the group, then chunk 1, ...
                     Example pp 2, N 3, M 5, V 2:  micro-batches 0 1 2 0 1 2 3 4 3 4
                                                   chunks        0 0 0 1 1 1 0 0 1 1
                     warmup = (pp - r - 1) * 2 + (V - 1) * N forwards, capped at M*V; then
                     "F(k + warmup) B(k)" pairs; B(k) runs micro-batch table[k] on chunk
                     V - 1 - table[k].chunk.
                     Megatron's rules: pp <= N <= M (ValueError), and M mod N must be 0 or
                     >= pp (RuntimeError, dependency bubbles), so with N = pp, M must be a
                     multiple of pp.
   forward_only: every forward in the same order, no backward; the warmup count stays
   min(pp - r - 1, M) for 1F1B and becomes M*V when interleaved. vpp 1 means not interleaved
   (Megatron's arguments turn a virtual size of 1 into None). */

typedef struct mc_sched_op {
    char kind;                 /* 'F' forward or 'B' backward */
    int microbatch;            /* 0 .. M-1 */
    int chunk;                 /* model chunk on this stage (0 unless interleaved); the
                                  virtual stage is chunk * pp + pp_rank */
} mc_sched_op;

/* Zero means default. */
typedef struct mc_schedule_desc {
    int pp;                    /* pipeline stages; default 1 */
    int pp_rank;               /* this stage, 0 .. pp-1 */
    int num_microbatches;      /* required, >= 1 */
    int vpp;                   /* model chunks per stage; 0 or 1: not interleaved */
    int group_size;            /* microbatch_group_size_per_vp_stage; default pp */
    int forward_only;
} mc_schedule_desc;

/* Megatron's get_forward_backward_func choice: "no_pipelining", "without_interleaving" or
   "with_interleaving" (NULL for a desc that fails validation). */
MC_API const char *mc_schedule_name(const mc_schedule_desc *desc);
/* Ops of stage desc->pp_rank in execution order: 2*M*V of them (M*V forward-only). Writes
   them into out[cap] and returns the count; out == NULL only counts; a cap below the count is
   MC_ERR_INVALID_ARG. *n_warmup (may be NULL) receives the warmup forward count. */
MC_API int mc_schedule_ops(const mc_schedule_desc *desc, mc_sched_op *out, int cap,
                           int *n_warmup);
/* The interleaved lookup table (one entry per virtual micro-batch; for a schedule that is not
   interleaved, micro-batch k on chunk 0). Returns M*V; out arrays may be NULL to count. */
MC_API int mc_schedule_table(const mc_schedule_desc *desc, int *microbatch, int *chunk, int cap);
/* The most micro-batches whose activations this stage holds at once on one chunk (forwarded,
   not yet backwarded), over the whole op order: what mc_gpt_desc.n_slots needs, since each
   chunk's held micro-batches are consecutive. 1F1B: min(pp - r, M); no pipelining: 1;
   forward_only: 1 (activations are dropped after each forward). per_chunk (may be NULL) receives
   each chunk's maximum (vpp entries, or 1). Returns the maximum or a negative status. */
MC_API int mc_schedule_max_in_flight(const mc_schedule_desc *desc, int *per_chunk);

typedef struct mc_schedule_timing {
    double makespan;           /* when the last op of any stage ends */
    double busy;               /* compute time of one stage (the same on every stage) */
    double bubble_fraction;    /* idle share of a stage's time: (makespan - busy) / makespan */
    double bubble_ratio;       /* idle over compute, (makespan - busy) / busy: the paper's
                                  measure, (pp - 1) / M for 1F1B */
} mc_schedule_timing;

/* Runs every stage's op list (desc->pp_rank is ignored) against the data dependencies and
   reports when each op starts. An op starts once its stage is free and its input is ready:
   F on virtual stage s needs F of the same micro-batch on s - 1; B on s needs F on s and B
   on s + 1. Communication takes no time. forward_time / backward_time are the cost of one op
   (one chunk); 0 means 1 and 2. start (may be NULL) receives pp rows of mc_schedule_ops'
   count, each in that stage's op order; cap is its length in doubles. */
MC_API int mc_schedule_simulate(const mc_schedule_desc *desc, double forward_time,
                                double backward_time, double *start, int cap,
                                mc_schedule_timing *timing);

/* @schedules:declarations begin */

/* ---------------------------------------------------------------------------------------------
   >>pipeline_parallel.schedules  Megatron's forward_backward functions (megatron_semantics.md section 8). The
   application (or lab) owns data and the model; the schedule owns the micro-batch order, the
   P2P between stages (batched), the grad-sync switch on each chunk's last micro-batch, and the
   call to finalize_model_grads.

   Op order: exactly mc_schedule_ops() of this stage (no pipelining, 1F1B, interleaved); the
   executed compute ops are traced into mc_schedule_result.ops, so a caller can compare. With
   hooks.clock set, each traced op also gets its start and end time (op_start / op_end): the
   stage's real timeline, e.g. for measuring the pipeline bubble against (p - 1) / (m + p - 1).

   The forward_step contract: for every micro-batch on every stage the schedule calls
   forward_step once per chunk; on the last virtual stage (pp rank P-1, chunk V-1) the output
   is the loss: forward_step sets *loss_sum (sum of per-token losses) and *num_tokens, and the
   schedule scales the backward seed like Megatron's loss_func 3-tuple path (not per-token):
       loss_scale = 1 / (max(num_tokens, 1) * num_microbatches)
   and passes it to that micro-batch's backward_step. With hooks->loss_func set (Megatron's
   forward_step_func returning (output_tensor, loss_func)), forward_step only returns its
   *output on the last virtual stage too, and the schedule calls loss_func(output) there, and
   nowhere else, for *loss_sum and *num_tokens.

   P2P (pp communicator, Megatron's cyclic next / prev ranks): one mc_batch_send_recv per
   exchange with the ops in Megatron's order send_prev, recv_prev, send_next, recv_next.
   recv_forward on the first virtual stage and recv_backward on the last one return NULL
   without communicating; sends there are no-ops. Activations travel on tag
   MC_SCHEDULE_TAG_FORWARD and gradients on MC_SCHEDULE_TAG_BACKWARD: at PP = 2 the next and
   previous ranks are the same peer, and interleaving can send both kinds to it in one batch.
   Megatron's batched path is tagless on NCCL, which pairs such ops by posting order: the
   activation lands in the gradient's buffer and the other way round (same size, no error).
   A tagless backend has to split that batch by direction.

   Buffer ownership:
     - received activations and gradients live in buffers the schedule allocates from the pp
       communicator (mc_comm_alloc: device memory on nccl). An input passed to forward_step stays
       valid and unchanged until that micro-batch's backward_step on the same chunk has returned
       (forward_only: until forward_step returns); an output_grad until backward_step returns.
       The model may keep the input pointer instead of copying it.
     - *output of forward_step belongs to the app and must stay valid until the backward of
       that micro-batch and chunk (forward_only: until the next forward_step call); *input_grad
       of backward_step until the next forward_step or backward_step call.

   Grad sync (Megatron's no_sync switch, per chunk; never called when forward_only):
       grad_sync(c, 0) for every chunk before the first compute op (sync off),
       grad_sync(c, 1) right before the backward of chunk c's micro-batch M-1 (its last),
       grad_sync(c, 0) right after that backward returns.
   So every backward but each chunk's last runs with sync off: the DDP layer only accumulates
   then, and with sync on starts the reductions of that chunk's buckets as they fill; finalize
   waits for them.

   The schedule does not write ps (ps->vp_stage included): forward_step and backward_step get
   the chunk and set whatever stage state the model reads. An error on one stage (a hook failing,
   a bad argument) returns at once there; its pipeline peers then fail in their next exchange
   with MC_ERR_TIMEOUT after the pp communicator's timeout. Validation errors (the interleaving
   rules) are the same on every rank, so every rank fails before communicating. */
#define MC_SCHEDULE_TRACE_MAX 4096
#define MC_SCHEDULE_TAG_FORWARD 1001     /* activations, to the next stage */
#define MC_SCHEDULE_TAG_BACKWARD 1002    /* gradients, to the previous stage */

typedef struct mc_schedule_hooks {
    void *app;
    /* input: tensor received from the previous virtual stage (NULL on the first one).
       *output: the tensor to send (owned by the app, see above). On the last virtual stage
       nothing is sent: *loss_sum and *num_tokens are set instead (both are 0 on entry), or,
       with loss_func, *output is what loss_func reads (valid until it returns). */
    int (*forward_step)(void *app, int chunk, int microbatch, const float *input,
                        float **output, double *loss_sum, double *num_tokens);
    /* output_grad: gradient received from the next virtual stage, NULL on the last one, where
       backward starts from the loss with per-token weight loss_scale (1 elsewhere).
       *input_grad: the gradient to send to the previous stage (ignored on the first virtual
       stage; may be left NULL there). Required unless every call is forward_only. */
    int (*backward_step)(void *app, int chunk, int microbatch, const float *output_grad,
                         float loss_scale, float **input_grad);
    /* Megatron's no_sync switch for chunk `chunk` (see above). May be NULL. */
    void (*grad_sync)(void *app, int chunk, int enable);
    /* finalize_model_grads (section 10); called once after the last backward, not when
       forward_only. May be NULL. A status != MC_OK is returned by the schedule. */
    int (*finalize)(void *app);
    /* Megatron's loss_func (may be NULL: forward_step then sets the loss itself). Called on
       the last virtual stage only, right after forward_step of the micro-batch, with that
       forward_step's *output (what the model returns there, e.g. per-token losses); sets
       *loss_sum and *num_tokens (both 0 on entry). The backward seed uses its num_tokens. */
    int (*loss_func)(void *app, int microbatch, const float *output, double *loss_sum,
                     double *num_tokens);
    size_t tensor_elems;            /* elements of every P2P tensor: S/CP (/TP under SP) * B * H;
                                       required (> 0) when PP > 1 */
    mc_dtype tensor_dtype;          /* of the P2P tensors: the model's dtype (default MC_F32) */
    int group_size;                 /* interleaved only: microbatch_group_size_per_vp_stage N;
                                       0 = PP (Megatron's default) */
    /* Optional clock for the trace, in seconds (e.g. CLOCK_MONOTONIC; a GPU app returns the
       time after synchronising its stream, so an op's end is its completion). When set, every
       traced compute op gets clock(app) right before its forward_step / backward_step call
       and right after the call returns (after loss_func too, on the last virtual stage)
       (mc_schedule_result.op_start / op_end): a timeline of
       this stage from which idle time (pipeline bubble, waits in P2P) can be measured. NULL:
       both stay 0. */
    double (*clock)(void *app);
} mc_schedule_hooks;

typedef struct mc_schedule_result {
    double loss_sum;                /* last stage: sum over micro-batches of per-token loss sums */
    double num_tokens;              /* last stage: sum of num_tokens (0 on other stages) */
    int n_warmup;                   /* warmup forwards this stage ran (mc_schedule_ops' count) */
    int n_ops;                      /* compute ops executed */
    mc_sched_op ops[MC_SCHEDULE_TRACE_MAX];   /* the first MC_SCHEDULE_TRACE_MAX of them, in
                                                 execution order */
    double op_start[MC_SCHEDULE_TRACE_MAX];   /* hooks->clock when ops[i]'s hook was called */
    double op_end[MC_SCHEDULE_TRACE_MAX];     /* ... and when it returned (0 without a clock) */
} mc_schedule_result;

/* All three share this signature. The result is reset at entry. num_microbatches is M (per
   data-parallel rank). Returns MC_OK, MC_ERR_INVALID_ARG / MC_ERR_INVALID_DESC (arguments,
   Megatron's interleaving rules), a hook's status, or a communication error. */
typedef int (*mc_forward_backward_func)(const mc_parallel_state *ps,
                                        const mc_schedule_hooks *hooks, int num_microbatches,
                                        int forward_only, mc_schedule_result *result);
/* Megatron's get_forward_backward_func, from ps->grid alone (section 8.1): PP > 1 with VPP > 1
   -> with_interleaving; PP > 1 -> without_interleaving; else no_pipelining. NULL for NULL ps. */
MC_API mc_forward_backward_func mc_get_forward_backward_func(const mc_parallel_state *ps);
/* PP must be 1: M times "F(i) B(i)", grad sync on for the last backward. */
MC_API int mc_forward_backward_no_pipelining(const mc_parallel_state *ps,
                                             const mc_schedule_hooks *hooks, int num_microbatches,
                                             int forward_only, mc_schedule_result *result);
/* 1F1B (section 8.4); refuses VPP > 1 (no model chunks). PP = 1 runs like no pipelining. */
MC_API int mc_forward_backward_pipelining_without_interleaving(
    const mc_parallel_state *ps, const mc_schedule_hooks *hooks, int num_microbatches,
    int forward_only, mc_schedule_result *result);
/* Interleaved 1F1B (section 8.5): needs PP > 1 and VPP > 1, PP <= N <= M and M mod N equal to
   0 or >= PP (the messages give Megatron's rules). */
MC_API int mc_forward_backward_pipelining_with_interleaving(
    const mc_parallel_state *ps, const mc_schedule_hooks *hooks, int num_microbatches,
    int forward_only, mc_schedule_result *result);

#if defined(MC_FAULT_HOOKS)
/* Fault injection, compiled only with MC_FAULT_HOOKS (lab11 and tests; ordinary builds have
   none of it). Process-wide, for every schedule run (not interleaved) while it is set: every
   stage skips micro-batch `microbatch`. The executor runs M - 1 of the M micro-batches it was
   asked for, calls forward_step / backward_step with the remaining ids (the result's trace
   shows them), keeps the backward seed's 1 / M and is consistent with itself, so no stage
   waits or fails: a silently dropped micro-batch. -1 turns it off; so does M == 1 or an id
   outside 0 .. M-1. */
MC_API void mc_fault_schedule_drop_microbatch(int microbatch);
#endif

/* @schedules:declarations end */

/* =============================================================================================
   transformer and models.gpt: the layer spec, the block, GPTModel */

/* @model:declarations begin */

/* ---------------------------------------------------------------------------------------------
   >>models.gpt  The transformer layer, the block and Megatron's GPTModel on the op table.

   One mc_gpt holds this rank's part of the model: the model chunks of its pipeline stage (one,
   or VPP chunks when interleaved), their parameters in ONE flat buffer (and the gradients in a
   second buffer of the same layout) described by an mc_param_table with Megatron's key names,
   and the saved activations of `n_slots` micro-batches per chunk.

       mc_gpt gpt;
       mc_gpt_init(&gpt, &(mc_gpt_desc){ .config = cfg, .ps = &ps, .n_slots = 4 });
       mc_gpt_zero_grad(&gpt);
       float *out; double loss_sum; float *dinp;
       mc_gpt_forward(&gpt, chunk, slot, tokens, labels, input, &out, &loss_sum);
       mc_gpt_backward(&gpt, chunk, slot, out_grad, 1.0f / (S * B), &dinp);
       mc_gpt_destroy(&gpt);

   Shapes (llm.c style; every activation is [S, B, C] row-major, token n = s * B + b):
     S seq_length, B micro_batch_size, N = S * B tokens, H hidden, NH heads, HD kv_channels,
     Q = NH * HD, F ffn_hidden_size, Vp padded vocab; TP splits heads, F and Vp:
     NHl = NH / TP, Ql = Q / TP, Fl = F / TP, Vl = Vp / TP. Ns = N / TP under sequence
     parallelism (the sequence is split into TP contiguous pieces), else N. The tensor a stage
     sends to the next one (the block output) is [Ns, H].
     tokens, labels: [S, B] ints (sequence first, like the activations). losses: [S, B].

   Stages and chunks (§7.1): chunk c of pipeline rank r is the virtual stage c * PP + r and
   builds L / (PP * VPP) layers starting at global layer c * (L / VPP) + r * (L / (PP * VPP)).
   pre_process (embedding) is chunk 0 of rank 0, post_process (final norm, output layer, loss)
   the last chunk of the last rank; with PP = 1 the one chunk is both.

   Parameters are registered in Megatron's module order, chunk by chunk:
       embedding.word_embeddings.weight        [Vp, H]   split on dim 0 (vocab)
       embedding.position_embeddings.weight    [P, H]    replicated (P = max positions)
       decoder.layers.{L}.input_layernorm.weight / .bias                      [H]
       decoder.layers.{L}.self_attention.linear_qkv.weight   [3Q, H] dim 0   .bias [3Q] dim 0
       decoder.layers.{L}.self_attention.linear_proj.weight  [H, Q]  dim 1   .bias [H]
       decoder.layers.{L}.pre_mlp_layernorm.weight / .bias                    [H]
       decoder.layers.{L}.mlp.linear_fc1.weight              [F, H]  dim 0   .bias [F] dim 0
       decoder.layers.{L}.mlp.linear_fc2.weight              [H, F]  dim 1   .bias [H]
       decoder.final_layernorm.weight / .bias                                 [H]
       output_layer.weight                                   [Vp, H] dim 0
   {L} is the GLOBAL layer index. The rows of linear_qkv are grouped per head, [q|k|v] of
   HD rows each, so a dim-0 shard holds whole heads. Norm parameters and the row-parallel
   biases carry sequence_parallel = 1 under SP (their grads are partial sums over the sequence
   shards and finalize sums them over TP). Biases and norm parameters have no_weight_decay.
   output_layer.weight exists when the embeddings are untied, or, tied with PP > 1, as the last
   stage's copy (shared = 1, shared_embedding = 1): zero-filled, then all-reduced over the
   embedding group at init so it equals the first stage's word embedding (§7.3); finalize keeps
   the two in step by all-reducing their grads. Tied with PP = 1 the output layer reads the
   word embedding itself and its gradient adds into the embedding's.

   Initialisation is the TP-invariant CPU initialisation (mc_init_normal_shard, std
   init_method_std; linear_proj and linear_fc2 weights std / sqrt(2 L); biases 0; norm weight 1,
   bias 0), so every shard equals the slice of the TP = 1, PP = 1 model's tensor. Note that the
   padded vocabulary depends on TP (ceil(V / (div * TP)) * div * TP): models compare across TP
   only when Vp comes out the same.

   Dropout and random streams (§6.3; tracker seeded like Megatron, §6.1):
     attention-probability dropout   model-parallel-rng (distinct per TP rank: local heads)
     hidden dropout (after linear_proj and linear_fc2), embedding dropout
                                     default generator without SP (the activation is
                                     replicated over TP, so all TP ranks draw the same mask),
                                     model-parallel-rng with SP (the activation is split).
   Every dropout takes (seed, offset) from its stream and advances the stream's offset by the
   element count (rounded up to 4), so the streams advance deterministically per micro-batch
   and layer. The mask is a pure function of (seed, offset): backward redraws it.

   Recompute (§6.4): full granularity keeps, per checkpointed group of layers, only the group's
   input and a snapshot of every RNG stream (mc_rng_tracker_get_states) taken before its
   forward; backward restores the snapshot, re-runs the group's forward, restores the current
   streams and then runs the group's backward. uniform: groups of recompute_num_layers
   consecutive layers of each chunk (the last may be shorter); block: each of the first
   recompute_num_layers layers of each chunk alone, the rest normally. The residual stream
   between layers outside the groups is kept ([Ns, H] per layer boundary). Selective
   granularity: the attention probabilities [B, NHl, S, S] are not kept; backward recomputes
   core attention with the same (seed, offset). Both give results bit-identical to no
   recompute: the same ops run on the same inputs in the same order. */

#define MC_GPT_MAX_CHUNKS MC_MAX_VPP

/* ---------------------------------------------------------------------------------------------
   >>transformer  One pre-LN layer: its tensors, the context its submodules run in and the spec
   (Megatron's TransformerLayer built from a ModuleSpec), whose local flavour is below. */

/* The tensors of one transformer layer, in registration order. */
typedef enum mc_gpt_layer_tensor {
    MC_GPT_LN1_W = 0,    /* input_layernorm.weight                (H) */
    MC_GPT_LN1_B,        /* input_layernorm.bias                  (H) */
    MC_GPT_QKV_W,        /* self_attention.linear_qkv.weight      (3Q/TP, H) */
    MC_GPT_QKV_B,        /* self_attention.linear_qkv.bias        (3Q/TP) */
    MC_GPT_PROJ_W,       /* self_attention.linear_proj.weight     (H, Q/TP) */
    MC_GPT_PROJ_B,       /* self_attention.linear_proj.bias       (H) */
    MC_GPT_LN2_W,        /* pre_mlp_layernorm.weight              (H) */
    MC_GPT_LN2_B,        /* pre_mlp_layernorm.bias                (H) */
    MC_GPT_FC1_W,        /* mlp.linear_fc1.weight                 (F/TP, H) */
    MC_GPT_FC1_B,        /* mlp.linear_fc1.bias                   (F/TP) */
    MC_GPT_FC2_W,        /* mlp.linear_fc2.weight                 (H, F/TP) */
    MC_GPT_FC2_B,        /* mlp.linear_fc2.bias                   (H) */
    MC_GPT_LAYER_TENSORS
} mc_gpt_layer_tensor;

typedef struct mc_gpt mc_gpt;
struct mc__gpt_layer_cache;   /* saved activations of one layer (private) */
struct mc__gpt_impl;          /* buffers and bookkeeping (private) */

/* Where a dropout sits (mc_gpt.dropout_drawn reports each draw). */
typedef enum mc_gpt_dropout_site {
    MC_GPT_DROPOUT_EMBEDDING = 0,      /* embedding output, [Ns, H] */
    MC_GPT_DROPOUT_ATTENTION_PROBS,    /* attention probabilities, [B, NHl, S, S] */
    MC_GPT_DROPOUT_ATTENTION_OUT,      /* hidden dropout after linear_proj, [Ns, H] */
    MC_GPT_DROPOUT_MLP_OUT,            /* hidden dropout after linear_fc2, [Ns, H] */
    MC_GPT_DROPOUT_SITES
} mc_gpt_dropout_site;

/* One dropout draw. Its mask is a pure function of the draw: element i of the tensor is kept
   iff mc_rng_uniform_at(seed, offset + i) >= p (mc_rng_dropout_mask on {seed, offset}). */
typedef struct mc_gpt_dropout_draw {
    mc_gpt_dropout_site site;
    int chunk;                      /* model chunk on this stage */
    int layer;                      /* GLOBAL layer index; -1 for the embedding */
    int replay;                     /* 1: drawn by a full-recompute replay in backward */
    const char *stream;             /* MC_RNG_DEFAULT or the tracker stream it came from */
    uint64_t seed, offset;          /* where in that stream the mask starts */
    size_t n;                       /* elements */
    float p;
} mc_gpt_dropout_draw;

/* What a submodule of one transformer layer works on: the layer's weights and grads (rank-
   local shards, pointers into the flat buffers, indexed by mc_gpt_layer_tensor) and the cache
   its forward fills and its backward reads. */
typedef struct mc_layer_ctx {
    mc_gpt *gpt;
    int chunk;                              /* model chunk on this stage */
    int layer;                              /* local layer index in the chunk */
    int global_layer;
    void *w[MC_GPT_LAYER_TENSORS];          /* the model's dtype */
    float *g[MC_GPT_LAYER_TENSORS];         /* fp32 */
    struct mc__gpt_layer_cache *cache;
    /* A spec's own attention (see attention_cache_bytes below): op memory for what its
       forward saves for its backward, one block per layer and micro-batch slot (a recomputed
       layer gets the replay's block), and one scratch block shared by every layer; NULL when
       the spec asks for none, or while the local attention runs. */
    void *attention_cache;
    void *attention_scratch;
} mc_layer_ctx;

/* Megatron's layer spec: the submodules of a pre-LN transformer layer as function pointers.
   The layer itself owns the dropouts and residuals:
       x1 = x + dropout(attention(norm(x, 0)));    out = x1 + dropout(mlp(norm(x1, 1)))
   Forward functions overwrite `out`; backward functions accumulate (+=) into parameter grads;
   norm_backward accumulates into dinp, attention_backward and mlp_backward overwrite it.
   In/outputs are [Ns, H] activations (op memory, the model's dtype).
   mc_transformer_spec_local() is Megatron's "local" spec: LayerNorm,
   ColumnParallel QKV + core attention on local heads + RowParallel projection, and a GELU
   MLP with ColumnParallel fc1 and RowParallel fc2.

   A spec that brings its own attention (Megatron's ModuleSpec with another self_attention
   module) copies the local spec and replaces the two attention functions. The model stays
   the same code: it registers the same parameters, owns the norms, residuals and hidden
   dropouts, and calls the module with the layer's weights. The module's contract:
     inp (Ns, H) -> out (Ns, H) with the weights of MC_GPT_QKV_W .. MC_GPT_PROJ_B (their
       shapes are fixed by the model: a dim-0 shard of whole heads, per-head [q|k|v] rows);
       the tensor-parallel communication is the module's (the mc_*_parallel_linear_* calls);
     attention-probability dropout draws from the model-parallel stream (MC_RNG_MODEL_PARALLEL
       of gpt->rng), and only while gpt->training and config.attention_dropout > 0;
     everything the backward needs lives in ctx->attention_cache (per micro-batch slot:
       pipeline schedules keep several micro-batches in flight) or is recomputed (selective
       recompute drops only the local attention's probabilities: the module decides what it
       keeps; full recompute replays its forward into the replay's cache block);
     backward accumulates (+=) into ctx->g and overwrites dinp.
   The optional fields (zero = none) describe the module to the model:
     attention_accepts(gpt, why, cap)  called once by mc_gpt_init with the model's sizes: 0
         accepts; non-zero refuses this shape and writes the reason. The model then runs the
         local attention in every layer instead, sets gpt->attention_fallback and the reason,
         and logs a warning (a feature gate with a fallback, like a fused kernel's);
     attention_cache_bytes(gpt)  bytes of ctx->attention_cache (while the spec's attention
         runs, the model keeps none of the local attention's tensors: mc_gpt_memory counts
         the module's bytes instead);
     attention_scratch_bytes(gpt)  bytes of ctx->attention_scratch;
     tensor_names  MC_GPT_LAYER_TENSORS names below "decoder.layers.{L}." (NULL, or a NULL
         entry: Megatron's name above). Names are the checkpoint keys: a spec that renames a
         tensor cannot load a checkpoint saved under the old name (and draws another initial
         value, which is keyed by name); the role (norm, scaled output projection) stays the
         tensor's. */
typedef struct mc_transformer_spec {
    const char *name;
    /* which: 0 input_layernorm, 1 pre_mlp_layernorm */
    int (*norm_forward)(const mc_layer_ctx *ctx, int which, void *out, const void *inp);
    int (*norm_backward)(const mc_layer_ctx *ctx, int which, void *dinp, const void *dout,
                         const void *inp);
    int (*attention_forward)(const mc_layer_ctx *ctx, void *out, const void *inp);
    int (*attention_backward)(const mc_layer_ctx *ctx, void *dinp, const void *dout,
                              const void *inp);
    int (*mlp_forward)(const mc_layer_ctx *ctx, void *out, const void *inp);
    int (*mlp_backward)(const mc_layer_ctx *ctx, void *dinp, const void *dout,
                        const void *inp);
    /* optional (see above) */
    int (*attention_accepts)(const mc_gpt *gpt, char *why, size_t why_cap);
    size_t (*attention_cache_bytes)(const mc_gpt *gpt);
    size_t (*attention_scratch_bytes)(const mc_gpt *gpt);
    const char *const *tensor_names;
} mc_transformer_spec;

MC_API const mc_transformer_spec *mc_transformer_spec_local(void);
/* Megatron's key of layer tensor t below "decoder.layers.{L}." ("self_attention.linear_qkv.
   weight"), whatever a spec calls it; NULL outside 0 .. MC_GPT_LAYER_TENSORS - 1. */
MC_API const char *mc_gpt_layer_tensor_name(int t);

/* ---------------------------------------------------------------------------------------------
   >>models.gpt.taps  Tensor taps, the analogue of forward and backward hooks on a module: with
   mc_gpt_desc.tap set, the model calls it at the end of every module's forward and backward
   with that module's tensors, so a debugger can compare them with a reference run (the
   tensor oracle of lab02). Unset (the default) a tap costs one pointer test per module.

   The tensors are op memory, valid only during the call (download what you keep), never to
   be written. In a backward tap `in` is the gradient of the module's input and `out` the
   gradient of its output. Modules, with Megatron's names and GLOBAL layer indices L:

     module                               forward in / out           backward in / out (grads)
     embedding                            - / res[0] [Ns, H]         - / d res[0]
     decoder.layers.L                     layer input / output       d input / d output
     decoder.layers.L.input_layernorm     x / ln [Ns, H]             - / d ln (the input grad
     decoder.layers.L.pre_mlp_layernorm   (likewise)                   also flows round the
                                                                      residual, so none here)
     decoder.layers.L.self_attention      ln / out, before dropout   d ln / d out
     decoder.layers.L.mlp                 (likewise)                 (likewise)
       the local spec also taps inside them:
       .self_attention.linear_qkv         ln / qkv [N, 3 Ql]         d ln / d qkv
       .self_attention.core_attention     qkv / context [N, Ql]      d qkv / d context
       .self_attention.linear_proj        context / out              d context / d out
       .mlp.linear_fc1                    ln / fc1 [N, Fl] (pre-GELU) d ln / d fc1
       .mlp.linear_fc2                    GELU(fc1) [N, Fl] / out    d GELU(fc1) / d out
     decoder.final_layernorm              block output / ln [Ns, H]  d block output / d ln
     output_layer                         ln / logits [N, Vl]        d ln / d logits
     loss                                 logits / losses [N] fp32   d logits / d losses

   [Ns, H] rows are this TP rank's sequence piece under SP (row_shard); the columns of
   [N, Vl], [N, 3 Ql], [N, Ql] and [N, Fl] are its vocab, head or ffn piece (col_shard).
   Under full recompute the replayed forwards call no tap. */
typedef struct mc_gpt_tap_tensor {
    const void *data;               /* op memory; NULL where the table above has "-" */
    mc_dtype dtype;
    int rows, cols;                 /* the local shape */
    int row_shard;                  /* rows are piece tp_rank of rows * TP (sequence parallel) */
    int col_shard;                  /* cols are piece tp_rank of cols * TP (vocab parallel) */
} mc_gpt_tap_tensor;

typedef struct mc_gpt_tap {
    const char *module;             /* "decoder.layers.2.self_attention" */
    int backward;                   /* 0: forward, 1: backward */
    int chunk, slot;
    int microbatch;                 /* the slot's micro-batch (mc_gpt_forward_step's), or -1 */
    int layer;                      /* global layer index, -1 outside the decoder layers */
    mc_gpt_tap_tensor in, out;
} mc_gpt_tap;

typedef void (*mc_gpt_tap_fn)(void *user, const mc_gpt_tap *tap);

/* ---------------------------------------------------------------------------------------------
   >>models.gpt  GPTModel (the shapes, stages and initialisation are described above). */

/* Zero means default. */
typedef struct mc_gpt_desc {
    mc_gpt_config config;           /* resolved (mc_gpt_config_resolve) or not: a config whose
                                       padded_vocab_size is 0 is resolved here */
    mc_parallel_state *ps;          /* NULL: one rank, no communication; else its grid must
                                       match the config's TP / PP / VPP */
    const mc_ops *ops;              /* default mc_ops_cpu(); must be the communicators' memory
                                       (mc_comm_memory of ps->world) */
    mc_dtype dtype;                 /* MC_F32 (default) or MC_BF16 (Megatron's --bf16): the
                                       parameters and activations; grads stay fp32 */
    const mc_transformer_spec *spec;/* default mc_transformer_spec_local() */
    int n_slots;                    /* micro-batches whose activations are kept at once per
                                       chunk (default 1; 1F1B needs PP, interleaving more) */
    int gather_logits;              /* 0 (default): parallel_output, logits stay [N, Vl];
                                       1: mc_gpt_logits returns them gathered [N, Vp] */
    int distributed_optimizer;      /* passed to mc_param_table_layout */
    size_t bucket_size;             /* DDP bucket size in elements; 0 = one bucket per chunk */
    mc_gpt_tap_fn tap;              /* tensor taps (>>models.gpt.taps); NULL: none */
    void *tap_user;
} mc_gpt_desc;

struct mc_gpt {
    mc_gpt_config config;           /* resolved */
    mc_parallel_state *ps;          /* may be NULL */
    const mc_ops *ops;
    mc_dtype dtype;                 /* of params and activations */
    const mc_transformer_spec *spec;/* as given (the default: the local spec) */
    int attention_fallback;         /* 1: the spec's attention refused this model's shape
                                       (attention_accepts) and every layer runs the local one */
    char attention_fallback_why[256];
    int n_slots;
    int gather_logits;
    /* sizes */
    int tp, tp_rank, pp, pp_rank, dp, dp_rank;
    int n_chunks;                   /* VPP, or 1 */
    int layers_per_chunk;           /* L / (PP * VPP) */
    int layer_offset[MC_GPT_MAX_CHUNKS];   /* global index of each chunk's first layer */
    int S, B, N, Ns, H, NH, HD, Q, F;
    int NHl, Ql, Fl;                /* per TP rank */
    int vocab_padded, vocab_local, vocab_start;
    int sequence_parallel;
    int tied;                       /* share_embeddings_and_output_weights */
    size_t p2p_elems;               /* Ns * H: what one stage sends the next */
    /* parameters */
    mc_param_table table;           /* names, shapes, flags, offsets (layout done) */
    void *params;                   /* (table.total) of dtype, op memory */
    float *grads;                   /* (table.total) fp32 parameter grads accumulate here (+=)
                                       (Megatron's main_grad with grad_reduce_in_fp32) */
    /* random streams: Megatron's tracker for this rank (seed, tp_rank, pp_rank) */
    mc_rng_tracker rng;
    int training;                   /* 1 after init: dropout on; 0: every dropout is off */
    /* DDP hook: called with a parameter's table index once backward has finished its grad
       (a layer's params after that layer's backward, the embedding's after the embedding's),
       only while grad sync is enabled for the chunk (mc_gpt_set_grad_sync, default on). */
    void (*grad_ready)(void *user, int param_index);
    void *grad_ready_user;
    int grad_sync[MC_GPT_MAX_CHUNKS];
    mc_gpt_tap_fn tap;              /* tensor taps (>>models.gpt.taps), may be set any time */
    void *tap_user;
    /* Debug tap, NULL (off) after init: called with every dropout draw of a forward, and of a
       recompute's replay, after its stream has advanced (one pointer test per draw when
       off). For reading masks, e.g. comparing them across TP ranks. */
    void (*dropout_drawn)(void *user, const mc_gpt_dropout_draw *draw);
    void *dropout_drawn_user;
    struct mc__gpt_impl *impl;      /* private */
};

/* Layers per chunk and the global index of a chunk's first layer (§7.1), for a config whose
   layer count divides evenly. Negative status when the config does not divide. */
MC_API int mc_gpt_num_layers_to_build(const mc_gpt_config *cfg);
MC_API int mc_gpt_layer_offset(const mc_gpt_config *cfg, int pp_rank, int vp_stage);

/* Validates the config (every violated rule in the error message), checks it against the
   parallel state, registers and lays out the parameters, allocates the two flat buffers and
   the activations, initialises the weights, ties the embedding copy over the embedding group
   (a collective over that group: both end stages call init together) and seeds the tracker. */
MC_API int mc_gpt_init(mc_gpt *gpt, const mc_gpt_desc *desc);
MC_API void mc_gpt_destroy(mc_gpt *gpt);
/* Bytes of op memory the model holds: parameters, grads and every activation arena (one per
   chunk and slot, plus the shared scratch); *activation_bytes (may be NULL) the arenas. */
MC_API size_t mc_gpt_memory(const mc_gpt *gpt, size_t *activation_bytes);

MC_API int mc_gpt_is_pre_process(const mc_gpt *gpt, int chunk);    /* embedding here */
MC_API int mc_gpt_is_post_process(const mc_gpt *gpt, int chunk);   /* norm + output + loss */

/* Forward of one micro-batch through one chunk, into activation slot `slot`.
   pre_process chunk: tokens [S, B] required, input ignored. Other chunks: input [Ns, H], the
   previous virtual stage's output (copied). post_process chunk: *output = NULL; with labels
   [S, B] the per-token losses are computed and *loss_sum (may be NULL) is their sum; without
   labels only the logits. Other chunks: *output = the block output [Ns, H], owned by the model
   and valid until the slot's next forward. Collectives: TP (and none over PP). */
MC_API int mc_gpt_forward(mc_gpt *gpt, int chunk, int slot, const int *tokens,
                          const int *labels, const float *input, float **output,
                          double *loss_sum);
/* Backward of the micro-batch in `slot`. post_process chunk: output_grad must be NULL and
   backward starts from the loss with d loss_n = loss_scale for every token. Other chunks:
   output_grad [Ns, H] from the next virtual stage. Parameter grads accumulate into
   gpt->grads. *input_grad = NULL on the pre_process chunk, else the gradient of the input
   [Ns, H] (owned by the model, valid until the slot's next backward). */
MC_API int mc_gpt_backward(mc_gpt *gpt, int chunk, int slot, const float *output_grad,
                           float loss_scale, float **input_grad);

/* The schedule adapter (mc_schedule_hooks): the application's hooks call these with the
   micro-batch's data. The slot is microbatch % n_slots; *num_tokens = S * B on the last
   stage. backward_step checks that the slot still holds `microbatch`. */
MC_API int mc_gpt_forward_step(mc_gpt *gpt, int chunk, int microbatch, const int *tokens,
                               const int *labels, const float *input, float **output,
                               double *loss_sum, double *num_tokens);
MC_API int mc_gpt_backward_step(mc_gpt *gpt, int chunk, int microbatch,
                                const float *output_grad, float loss_scale, float **input_grad);

MC_API int mc_gpt_zero_grad(mc_gpt *gpt);
MC_API void mc_gpt_set_grad_sync(mc_gpt *gpt, int chunk, int enable);
/* The local shard of a parameter (the model's dtype) / of its fp32 grad by Megatron name, in op
   memory; NULL when not on this rank. */
MC_API void *mc_gpt_param(const mc_gpt *gpt, const char *name);
MC_API float *mc_gpt_grad(const mc_gpt *gpt, const char *name);
/* Per-token losses [S, B] (fp32, op memory) of the slot's last forward on the post_process
   chunk. */
MC_API const float *mc_gpt_losses(const mc_gpt *gpt, int slot);
/* Logits of the slot's last forward on the post_process chunk, converted to fp32 into out (op
   memory): [N, Vl] (parallel_output), or, with gather_logits, all-gathered over TP into
   out [N, Vp] (a TP collective). *n_vocab receives the row length. */
MC_API int mc_gpt_logits(mc_gpt *gpt, int slot, float *out, int *n_vocab);

#if defined(MC_FAULT_HOOKS)
/* Fault injection for the RNG rules, compiled only with MC_FAULT_HOOKS (labs and tests;
   ordinary builds have none of it). Process-wide, for every model while set.
   mc_fault_dropout_stream: every dropout draws from `stream` instead of the one Megatron's
   rules pick: MC_RNG_DEFAULT is "one global seed" (the default generator, seeded alike on
   every TP rank), MC_RNG_MODEL_PARALLEL "a seed per rank" (seed' + 2718 + tp_rank for every
   mask). NULL (or a name the tracker lacks: the draw then fails) restores the rules. */
MC_API void mc_fault_dropout_stream(const char *stream);
/* mc_fault_recompute_rng: full recompute's RNG handling without one or both of its steps.
   MC_FAULT_RECOMPUTE_NO_SNAPSHOT: the replay runs on the streams as they are at backward time
   instead of the snapshot taken before the group's forward; MC_FAULT_RECOMPUTE_NO_OUTER: after
   the replay the streams stay where it left them instead of returning to the outer progress.
   0 restores both. */
#define MC_FAULT_RECOMPUTE_NO_SNAPSHOT 1u
#define MC_FAULT_RECOMPUTE_NO_OUTER 2u
MC_API void mc_fault_recompute_rng(unsigned flags);
#endif

/* @model:declarations end */

/* =============================================================================================
   distributed, optimizer, dist_checkpointing */

/* @ddp:declarations begin */

/* ---------------------------------------------------------------------------------------------
   >>distributed  Megatron's DistributedDataParallel over the flat gradient buffer of an mc_param_table,
   and finalize_model_grads (megatron_semantics.md §10, §11).

   One mc_ddp per rank reduces the grads of every model chunk over the data-parallel (x CP)
   group, bucket by bucket. A bucket's collective is: scale the bucket by 1/DP, then SUM
       all-reduce                 without the distributed optimizer: every DP rank ends up
                                  with the mean gradient of the whole bucket;
       reduce-scatter             with it: DP rank d receives the mean of its shard
                                  [start + d*size/DP, start + (d+1)*size/DP) of each bucket
                                  (mc_ddp_shard); the rest of its bucket keeps stale local
                                  values that nothing reads.

       mc_ddp_zero_grad(&ddp);                          // iteration start
       for each micro-batch mb of M:
           mc_ddp_set_grad_sync(&ddp, -1, mb == M - 1); // Megatron's no_sync() otherwise
           backward(...);     // calls mc_ddp_register_grad_ready(&ddp, i) when param i's
                              // grad is final: a bucket whose params are all ready starts
                              // its async collective while backward goes on
       mc_finalize_model_grads(&ps, &ddp, NULL, NULL, sp, NULL);  // waits (§10 order)

   Overlap off (overlap_grad_reduce = 0): registrations are ignored and finish_grad_sync runs
   every bucket's collective blocking. Either way every DP rank must launch the buckets in the
   same order (the same backward does). Grad sync starts disabled after init and zero_grad:
   the schedule (grad_sync hook) or the caller enables it for the last micro-batch. The event
   log says when each bucket was launched and waited, counted in grad-ready registrations, so
   a lab can show that bucket 0 went out while later params were still being computed. */

typedef enum mc_ddp_event_kind {
    MC_DDP_LAUNCH = 1,   /* async collective started */
    MC_DDP_WAIT,         /* finish_grad_sync waited for an async collective */
    MC_DDP_SYNC          /* collective run blocking (overlap off) */
} mc_ddp_event_kind;

typedef struct mc_ddp_event {
    mc_ddp_event_kind kind;
    int bucket;
    int params_ready;    /* grad-ready registrations counted so far in this iteration */
} mc_ddp_event;

/* Zero means default. */
typedef struct mc_ddp_desc {
    mc_param_table *table;          /* required, laid out (mc_param_table_layout) */
    float *grads;                   /* required: the flat gradient buffer [table->total] */
    mc_comm *dp;                    /* data-parallel x CP group; NULL = DP 1 (no communication) */
    int distributed_optimizer;      /* reduce-scatter; must match table->layout */
    int overlap_grad_reduce;        /* launch buckets from register_grad_ready */
    int calculate_per_token_loss;   /* 1: bucket factor 1 instead of 1/DP (finalize divides by
                                       the global token count, §11.4) */
    float gradient_scaling_factor;  /* bucket factor before the SUM; 0 = 1/size(dp). Megatron's
                                       expert buffers reduce over expert-DP but are scaled by
                                       1/(DP x CP), the dense data-parallel size: pass that */
    const mc_ops *ops;              /* default mc_ops_cpu() */
} mc_ddp_desc;

typedef struct mc_ddp {
    mc_ddp_desc desc;               /* resolved */
    int dp_size, dp_rank;
    float scale;                    /* applied to a bucket before its SUM: 1/DP, 1 or the factor */
    int grad_sync[MC_MAX_VPP];      /* per chunk: 1 while its last micro-batch runs */
    int params_ready;               /* registrations since zero_grad */
    int n_events;
    mc_ddp_event *events;           /* [2 * n_buckets]: the log of this iteration */
    /* Private. */
    int *bucket_of;                 /* [table->count] bucket of each param */
    unsigned char *ready;           /* [table->count] */
    int *bucket_ready;              /* [n_buckets] params of the bucket registered ready */
    int *bucket_state;              /* [n_buckets] idle, in flight, done */
    mc_request **requests;          /* [n_buckets] */
    int finished;                   /* finish_grad_sync ran since the last zero_grad */
} mc_ddp;

/* Validates (table laid out, grads set, dp size = table->layout.dp_size and the flags equal
   under the distributed optimizer) and allocates the bookkeeping; does not touch grads. */
MC_API int mc_ddp_init(mc_ddp *ddp, const mc_ddp_desc *desc);
/* MC_ERR_BUSY (and nothing freed) while a bucket's collective is in flight. */
MC_API int mc_ddp_destroy(mc_ddp *ddp);
/* zero_grad_buffer: zeroes the grads (padding included), forgets the registrations and the
   event log, disables grad sync. MC_ERR_BUSY while a collective is in flight. */
MC_API int mc_ddp_zero_grad(mc_ddp *ddp);
/* Enables (1) or disables (0) grad sync for model chunk `chunk` (-1: every chunk). */
MC_API int mc_ddp_set_grad_sync(mc_ddp *ddp, int chunk, int enable);
/* Param `param` (index in the table) has its final grad. Ignored unless overlap is on and
   grad sync is enabled for the param's chunk; a second registration in one iteration is
   MC_ERR_STATE. Launches the bucket's async collective when it was the bucket's last param. */
MC_API int mc_ddp_register_grad_ready(mc_ddp *ddp, int param);
/* Launches every bucket not launched yet (async with overlap, else blocking). */
MC_API int mc_ddp_start_grad_sync(mc_ddp *ddp);
/* Launches what is left, then waits for every bucket; grads are reduced on return. A second
   call before the next zero_grad is MC_ERR_STATE (it would reduce nothing new). */
MC_API int mc_ddp_finish_grad_sync(mc_ddp *ddp);
/* [*start, *end) of bucket `bucket` in the flat buffer that this DP rank owns: its
   reduce-scatter shard under the distributed optimizer, else the whole bucket. */
MC_API int mc_ddp_shard(const mc_ddp *ddp, int bucket, size_t *start, size_t *end);

/* Megatron's finalize_model_grads, in its order (§10):
     1. DP: mc_ddp_finish_grad_sync (skipped when ddp is NULL);
     2. (conditional embedders: not in a GPT);
     3. sequence parallel on and TP > 1: the grads of params flagged sequence_parallel are
        summed over TP, packed into one buffer for a single all-reduce;
     4. tied embeddings: this rank in an embedding group of size > 1 sums the grads of its
        shared_embedding params over the group (the first stage's word embedding with the
        last stage's output copy);
     5. position-embedding group: size 1 in a GPT, nothing to do;
     7. num_tokens != NULL: *num_tokens is broadcast from the last pipeline stage, summed
        over DP x CP, and every grad is scaled by 1 / max(*num_tokens, 1); *num_tokens holds
        the global count on return.
   table and grads default to the ddp's; ps may be NULL (one model-parallel rank: steps 3 and
   4 do nothing). Under the distributed optimizer steps 3 and 4 reduce whole params although
   only this rank's shard is valid after step 1: the stale rest of each sum is never read. */
MC_API int mc_finalize_model_grads(const mc_parallel_state *ps, mc_ddp *ddp,
                                   const mc_param_table *table, float *grads,
                                   int sequence_parallel, double *num_tokens);

#if defined(MC_FAULT_HOOKS)
/* Fault injection, compiled only with MC_FAULT_HOOKS (labs 07 and 08 and tests; ordinary
   builds have none of it). Process-wide while on: mc_finalize_model_grads skips step 1 (the DP
   finish_grad_sync) and runs the others, as a training loop that steps the optimizer before
   finish_grad_sync does: the optimizer then reads grads that are not reduced over DP (with
   overlap off nothing was launched yet, so each DP replica steps on its own gradient; with
   overlap on, collectives still in flight write the buffer meanwhile). The caller closes the
   collectives with mc_ddp_finish_grad_sync after the step, too late to matter, so that the
   next zero_grad finds nothing in flight. 0 turns it off. */
MC_API void mc_fault_finalize_skip_grad_sync(int on);
/* Process-wide while skip != 0: mc_finalize_model_grads leaves out step 4, the
   all-reduce of the tied word embedding's grads over the embedding group. The first stage's
   word embedding then steps with its embedding-lookup gradient only and the last stage's
   output-layer copy with its logits gradient only, so the two replicas drift apart (the
   untying of Megatron-LM #656). 0 turns it off. */
MC_API void mc_fault_finalize_skip_embedding_sync(int skip);
#endif

/* @ddp:declarations end */

/* @optimizer:declarations begin */

/* ---------------------------------------------------------------------------------------------
   >>optimizer  AdamW with fp32 state over the flat buffers, Megatron's learning-rate schedule
   (OptimizerParamScheduler) and its model-parallel-aware grad norm and clipping
   (megatron_semantics.md §11.6, §12).

   A step, after mc_finalize_model_grads (fp32 grads and state; bf16 needs no loss scaler, as
   in Megatron, and a non-finite norm skips the step):
     1. lr = mc_optimizer_lr_at(&opt.desc, opt.lr_steps);
     2. clip_grad > 0: the grad norm over every logical parameter once (below), and the grads
        scaled by clip_grad / (norm + 1e-6) when that is < 1;
     3. AdamW on every param (weight decay 0 for no_weight_decay params: biases and norms),
        m and v in the same layout as the params, in ONE op over a span table made at init;
        with bf16 params the fp32 main parameters are stepped and the params rewritten
        (Megatron's Float16OptimizerWithFloat16Params);
        distributed optimizer: only this DP rank's shard of each bucket (mc_ddp_shard) is
        stepped and has state, then each bucket's params are all-gathered over DP;
     4. lr_steps and iteration advance by one.
   Everything stays in op memory: the grad norm's partial is one sum_squares op over a span
   table, all-reduced as a device scalar (fp64) and read back once per step.

   Grad norm (§12): a param counts if it is not `shared` (the tied output copy) and is either
   tensor_model_parallel or on TP rank 0 (replicas counted once). Local sum of squares in fp64,
   all-reduced (SUM) over the model-parallel group TP x PP, or over the whole world under the
   distributed optimizer, where each DP rank adds only its disjoint shard (padding is never a
   param, so it adds nothing). Both give the same norm.

   Learning rate at scheduler step s (Megatron's num_steps in iterations; a caller counting
   samples gives warmup / decay in samples and sets lr_steps to the consumed samples):
       s <= warmup (warmup > 0):  init + (lr - init) * s / warmup
       constant style:            lr
       s > decay:                 min_lr
       else r = (s - warmup) / (decay - warmup):
           cosine  min_lr + (lr - min_lr) * 0.5 * (cos(pi r) + 1)
           linear  min_lr + (lr - min_lr) * (1 - r)
   Step k (1-based) uses s = k - 1, as Megatron does (the scheduler steps after the
   optimizer), so with warmup the first step runs at lr_warmup_init. Megatron's log line
   prints the rate for the NEXT step: mc_optimizer_lr_at(&opt.desc, opt.lr_steps). */

typedef enum mc_lr_decay_style {
    MC_LR_DECAY_COSINE = 0, MC_LR_DECAY_LINEAR, MC_LR_DECAY_CONSTANT
} mc_lr_decay_style;

typedef enum mc_optimizer_state_kind {
    MC_OPTIM_EXP_AVG = 0,   /* Adam's m */
    MC_OPTIM_EXP_AVG_SQ     /* Adam's v */
} mc_optimizer_state_kind;

#define MC_WEIGHT_DECAY_OFF (-1.0f)
#define MC_CLIP_GRAD_OFF (-1.0f)

/* Zero means default:
     lr required (> 0)   | min_lr 0            | lr_warmup_init 0  | lr_warmup_iters 0
     lr_decay_iters = train_iters (both 0: no decay) | lr_decay_style cosine
     weight_decay 0.01 (MC_WEIGHT_DECAY_OFF: none)   | beta1 0.9 | beta2 0.999 | eps 1e-8
     clip_grad 1.0 (MC_CLIP_GRAD_OFF or any negative: no clipping, reported norm 0) */
typedef struct mc_optimizer_desc {
    mc_ddp *ddp;                    /* required: table, grads, DP group, distributed optimizer */
    void *params;                   /* required: the model's flat parameters [table->total] */
    mc_dtype params_dtype;          /* MC_F32 (default): params are the fp32 masters; MC_BF16
                                       (--bf16): the optimizer keeps fp32 main parameters
                                       (initialised from params) and writes params back in bf16
                                       after every step */
    const mc_parallel_state *ps;    /* TP rank and grad-norm groups; NULL: one model-parallel
                                       rank (the norm is reduced over the ddp's DP group only
                                       under the distributed optimizer) */
    const mc_ops *ops;              /* default: the ddp's */
    float lr;
    float min_lr;
    float lr_warmup_init;
    long long lr_warmup_iters;
    long long lr_decay_iters;
    long long train_iters;
    mc_lr_decay_style lr_decay_style;
    float weight_decay;
    float beta1, beta2, eps;
    float clip_grad;
} mc_optimizer_desc;

typedef struct mc_optimizer {
    mc_optimizer_desc desc;         /* resolved */
    long long iteration;            /* steps taken (Adam's bias correction uses iteration) */
    long long lr_steps;             /* scheduler position (Megatron's num_steps) */
    float last_lr;                  /* learning rate of the last step */
    double last_grad_norm;          /* its grad norm before clipping; 0 when clipping is off */
    float last_clip_coeff;          /* the factor the grads were scaled by (1: not clipped) */
    float *m, *v;                   /* [state_numel] op memory; m[i] belongs to param element i,
                                       or under the distributed optimizer to shard element i:
                                       bucket b's shard starts at buckets[b].start / DP */
    float *main;                    /* [state_numel] fp32 main parameters in the layout of m
                                       (bf16 params only; NULL when params are fp32) */
    size_t state_numel;             /* table->total, or table->total / DP */
    /* Private. */
    int tp_rank;
    mc_comm *stats;                 /* grad-norm group; NULL: local */
    size_t *norm_spans;             /* op memory: [lo, hi) pairs the grad norm sums (§12) */
    int n_norm_spans;
    mc_adamw_span *adamw_spans;     /* op memory: what each step updates */
    int n_adamw_spans;
    double *norm_sum;               /* op memory: the sum of squares, all-reduced in place */
} mc_optimizer;

/* Validates the desc (Megatron's scheduler asserts: min_lr <= lr, warmup < decay when
   decaying; betas in [0, 1), eps > 0) and allocates zeroed state. */
MC_API int mc_optimizer_init(mc_optimizer *opt, const mc_optimizer_desc *desc);
MC_API void mc_optimizer_destroy(mc_optimizer *opt);
/* The learning rate at scheduler step num_steps for a desc (defaults applied). */
MC_API double mc_optimizer_lr_at(const mc_optimizer_desc *desc, long long num_steps);
/* The §12 grad norm of the current grads (collective over the grad-norm group). */
MC_API int mc_optimizer_grad_norm(mc_optimizer *opt, double *norm);
/* One step (see above); collective over the grad-norm group and, under the distributed
   optimizer, over DP. A non-finite grad norm skips the update with MC_ERR_STATE. */
MC_API int mc_optimizer_step(mc_optimizer *opt);

/* Optimizer state per param, in the param's own (local TP shard) terms, for checkpoints.
   owned range: the elements [*lo, *hi) of param `param` whose state this rank holds:
   [0, numel) without the distributed optimizer, else the part inside this DP rank's shards
   (possibly empty, lo == hi). */
MC_API int mc_optimizer_owned_range(const mc_optimizer *opt, int param, size_t *lo, size_t *hi);
/* out[numel] = the whole m or v of the param. Under the distributed optimizer a collective
   over DP (every DP rank calls it for the same param) that assembles the owners' pieces. */
MC_API int mc_optimizer_get_state(mc_optimizer *opt, int param, mc_optimizer_state_kind which,
                                  float *out);
/* Stores the owned part of in[numel] (the whole m or v of the param); local, no collective. */
MC_API int mc_optimizer_set_state(mc_optimizer *opt, int param, mc_optimizer_state_kind which,
                                  const float *in);

/* @optimizer:declarations end */

/* @checkpoint:declarations begin */

/* ---------------------------------------------------------------------------------------------
   >>dist_checkpointing  Checkpoints that load under another TP / PP / DP layout (resharding).

   Every tensor is stored in GLOBAL form, whatever the layout that saved it: one file per tensor
   holding the full [rows, cols] array, written cooperatively. Each rank writes the rows or
   columns of its shard at their global offsets, and on load each rank reads exactly the slices
   of its current layout. Keys are Megatron's names with GLOBAL layer indices, so they do not
   depend on PP or VPP either (megatron_semantics.md §14).

   Directory (Megatron's training layout):
       <dir>/latest_checkpointed_iteration.txt   "10\n" (or "release"), replaced atomically
       <dir>/iter_0000010/metadata.txt           written last, by world rank 0
       <dir>/iter_0000010/model.<name>.bin       one per parameter
       <dir>/iter_0000010/exp_avg.<name>.bin     Adam m, when saved (and exp_avg_sq.<name>.bin)
       <dir>/iter_0000010/rng_pp000_tp00.txt     RNG states of each (pp, tp) position

   Who writes (main replicas, §14): the rank with dp = cp = 0 of each (tp, pp) position, and for
   a parameter replicated across TP (partition_dim -1) only its tp rank 0. The tied last-stage
   copy of the word embedding (`shared`) is never written; on load it is filled from
   MC_CKPT_TIED_KEY. A parameter split along `partition_dim` with `partition_stride` s follows
   Megatron's stride rule: the local extent is s pieces; local piece k is global piece
   k * TP + tp_rank. Before writing, the ranks exchange what they wrote and the save fails
   unless every tensor's elements were written exactly once.

   Atomicity: everything goes into <dir>/iter_0000010.tmp/ (a stale one from an interrupted save
   is removed first). After a barrier the world computes a CRC32 of every file (file i by world
   rank i mod world size, so the work is spread; collected with one all-reduce). Rank 0 writes
   metadata.txt.tmp, fsyncs it, renames it to metadata.txt, renames the directory to
   iter_0000010 (an existing directory of that iteration is removed first) and replaces `latest`
   through a temp file and a rename, fsyncing the directory after each rename. A crash at any
   point before the directory rename leaves the previous checkpoint and `latest` as they were;
   loaders never look at *.tmp.

   Tensor file: a 64-byte header, then the elements, row-major, host byte order (metadata
   records it; a loader with the other order refuses):
       bytes  0.. 7  "MCTENSOR"             bytes 16..19  u32 ndim (1 or 2)
       bytes  8..11  u32 format version (1) bytes 20..23  u32 0x01020304 (byte-order mark)
       bytes 12..15  u32 dtype (0 = f32)    bytes 24..39  u64 shape[0], shape[1] (1 for 1-D)
       bytes 40..63  zero
   RNG file (text): "megatron_c-rng 1", "position pp P tp T", "current SEED OFFSET", then one
   "stream NAME SEED OFFSET" per tracker stream.

   metadata.txt: one record per line, fields separated by single spaces, "\n" line ends:
       megatron_c-checkpoint 1                  first line: magic and format version
       byte_order little                        or big
       iteration 10                             |
       consumed_samples 640                     | the training scalars
       optimizer_step 10                        |
       math_fingerprint 0123456789abcdef        mc_gpt_config_math_fingerprint, 16 hex digits
       layout_fingerprint 0123456789abcdef      mc_gpt_config_layout_fingerprint
       layout tp 2 pp 2 dp 2 cp 1 vpp 0 world 8 the layout that saved
       config <field> <value>                   one per field of the RESOLVED mc_gpt_config
                                                (floats as %.9g, which reads back exactly)
       tensor <kind> <name> f32 <ndim> <d0> [<d1>] <file> <bytes> <crc32>
                                                kind: model, exp_avg or exp_avg_sq; bytes and
                                                crc32 (8 hex digits) of the whole file
       rng <pp> <tp> <file> <bytes> <crc32>
       end <crc32>                              last line: CRC32 of every byte before it
   Unknown keys (and unknown config fields) are ignored, as Megatron ignores unknown keys; a
   missing `end` line means a truncated file, a wrong CRC a corrupted one.

   Loading (mc_checkpoint_load) checks, in order: the metadata (magic, version, byte order,
   checksum); the math fingerprint against the current config (a mismatch is MC_ERR_INVALID_DESC
   naming every differing field, through mc_gpt_config_math_diff, unless
   MC_CKPT_LOAD_IGNORE_MATH is set; the layout may differ); that every local parameter has a
   tensor of compatible global shape; every file's size and CRC32 (spread over the world like
   the save); then each rank reads its slices. Shapes must match, with one exception: a
   vocabulary-padded tensor (dim 0 equal to the padded vocabulary of its config, e.g. 50304 at
   TP 1 and 50432 at TP 2 for 50257) may change its row count: rows present in both are read,
   further rows are zero. The RNG states are restored when the checkpoint holds the same
   (pp, tp) position at the same TP and PP sizes; otherwise the tracker is reseeded as at start
   (mc_rng_tracker_seed_megatron with config->seed) and the result says so. Every error is
   agreed over the world: all ranks return the status and the message of the first failing
   rank ("rank 3: ..."), nobody waits on a rank that gave up. Statuses: MC_ERR_INVALID_ARG for
   the desc (or ranks passing different iterations, configs, optimizer or RNG choices),
   MC_ERR_INVALID_DESC for the parameter table, a math mismatch or a tensor of another shape,
   MC_ERR_IO for missing, truncated or corrupted files and file-system errors,
   MC_ERR_UNSUPPORTED for tensor files of the other byte order.
   The collectives run with the world communicator's timeout: ranks wait there while others
   write or checksum, so a checkpoint that takes longer than that needs a larger
   mc_comm_desc.timeout_s.

       mc_checkpoint_desc cd = {0};
       cd.dir = "ckpt"; cd.ps = &ps; cd.config = &cfg; cd.params = &table;
       cd.param_data = params; cd.exp_avg = m; cd.exp_avg_sq = v; cd.rng = &tracker;
       cd.iteration = 10; cd.consumed_samples = 640; cd.optimizer_step = 10;
       mc_checkpoint_save(&cd);                         // -> ckpt/iter_0000010, latest = 10
       ... later, under another layout:
       mc_checkpoint_result res;
       mc_checkpoint_load(&cd, 0, &res);                // res.iteration == 10, res.resharded

   POSIX is required (open, lseek/read/write on a descriptor of one's own, fsync, rename,
   mkdir, opendir); elsewhere save and load return MC_ERR_UNSUPPORTED. Not supported: bf16
   storage, data_parallel_random_init (one RNG file per (pp, tp)), expert parallelism. */
#define MC_CKPT_FORMAT_VERSION 1
#define MC_CKPT_LATEST_FILE "latest_checkpointed_iteration.txt"
#define MC_CKPT_METADATA_FILE "metadata.txt"
#define MC_CKPT_TIED_KEY "embedding.word_embeddings.weight"   /* source of the `shared` copy */
#define MC_CKPT_RELEASE (-1LL)          /* the iteration of a "release" checkpoint directory */
#define MC_CKPT_HEADER_BYTES 64
#define MC_CKPT_PATH_MAX 1024
#define MC_CKPT_FILE_MAX (MC_PARAM_NAME_MAX + 24)

/* mc_checkpoint_load flags. */
#define MC_CKPT_LOAD_ITERATION 1u       /* load desc->iteration instead of `latest` */
#define MC_CKPT_LOAD_IGNORE_MATH 2u     /* accept a math-fingerprint mismatch (logs a warning) */
#define MC_CKPT_LOAD_NO_RNG 4u          /* leave the RNG tracker alone (Megatron's --no-load-rng) */

/* The same desc serves save and load; every rank of the world passes its own. */
typedef struct mc_checkpoint_desc {
    const char *dir;                 /* required: the --save / --load directory */
    const mc_parallel_state *ps;     /* required: layout, this rank's coordinates, the world */
    const mc_gpt_config *config;     /* required: fingerprints, config text, vocab padding, seed */
    const mc_param_table *params;    /* required: this rank's table, offsets set */
    float *param_data;               /* required: the flat buffer [params->total]; load writes
                                        only the parameters' elements, never the padding */
    float *exp_avg;                  /* optional: Adam m in the same layout ...               */
    float *exp_avg_sq;               /* ... and v: both or neither; full local shards        */
    const struct mc_ops *ops;        /* whose memory the three buffers are; default the CPU's.
                                        Device buffers are copied to the host and back (load
                                        writes them back only when it succeeds) */
    mc_rng_tracker *rng;             /* optional: saved per (pp, tp); restored or reseeded */
    long long iteration;             /* save: >= 0, the same on every rank; load: read with
                                        MC_CKPT_LOAD_ITERATION (MC_CKPT_RELEASE: "release") */
    long long consumed_samples;      /* save: >= 0 */
    long long optimizer_step;        /* save: >= 0, Adam's step count */
} mc_checkpoint_desc;

typedef struct mc_checkpoint_result {
    long long iteration;
    long long consumed_samples;
    long long optimizer_step;
    int saved_tp, saved_pp, saved_dp, saved_cp, saved_vpp, saved_world;
    int resharded;                   /* the saved layout differs from the current one */
    int math_mismatch_ignored;       /* loaded under MC_CKPT_LOAD_IGNORE_MATH despite a mismatch */
    int optimizer_loaded;            /* exp_avg / exp_avg_sq were filled */
    int rng_restored;                /* 1: states of this (pp, tp) restored; 0: see note */
    char path[MC_CKPT_PATH_MAX];     /* the iteration directory that was read */
    char note[512];                  /* e.g. "RNG states reset: saved at TP 2 PP 2, now ..." */
} mc_checkpoint_result;

/* Collective over ps->world. Returns MC_OK on every rank or the same error on every rank. */
MC_API int mc_checkpoint_save(const mc_checkpoint_desc *desc);
/* Collective over ps->world; result may be NULL. Fills params (and m, v when given) for the
   current layout, restores or reseeds the RNG tracker. */
MC_API int mc_checkpoint_load(const mc_checkpoint_desc *desc, unsigned flags,
                              mc_checkpoint_result *result);

/* Reads <dir>/latest_checkpointed_iteration.txt: the iteration, or MC_CKPT_RELEASE. MC_ERR_IO
   when the file is missing or does not hold an integer or "release". Local, no communication. */
MC_API int mc_checkpoint_latest(const char *dir, long long *iteration);
/* "<dir>/iter_0000010" (or "<dir>/release"); MC_ERR_INVALID_ARG when it does not fit. */
MC_API int mc_checkpoint_iteration_dir(char *out, size_t cap, const char *dir,
                                       long long iteration);

/* The parsed metadata.txt. */
typedef struct mc_checkpoint_tensor {
    char kind[16];                   /* "model", "exp_avg", "exp_avg_sq" */
    char name[MC_PARAM_NAME_MAX];
    int ndim;
    long long shape[2];              /* shape[1] = 1 for 1-D */
    char file[MC_CKPT_FILE_MAX];     /* relative to the iteration directory */
    long long bytes;                 /* header included */
    uint32_t crc32;
} mc_checkpoint_tensor;

typedef struct mc_checkpoint_rng_file {
    int pp, tp;
    char file[32];
    long long bytes;
    uint32_t crc32;
} mc_checkpoint_rng_file;

typedef struct mc_checkpoint_meta {
    int format_version;
    int big_endian;                  /* byte order of the tensor files */
    long long iteration, consumed_samples, optimizer_step;
    uint64_t math_fingerprint, layout_fingerprint;
    int tp, pp, dp, cp, vpp, world;
    mc_gpt_config config;            /* fields absent from the file keep the `base` values */
    int n_tensors;                   /* sorted by (kind, name) */
    mc_checkpoint_tensor *tensors;
    int n_rng;
    mc_checkpoint_rng_file *rng;
} mc_checkpoint_meta;

/* Parses metadata text (`source` names it in messages). `base` (may be NULL: zeros) seeds the
   config, so fields the file does not mention compare equal. MC_ERR_IO with the line number and
   the rule for every format error. Free with mc_checkpoint_meta_destroy (also after an error). */
MC_API int mc_checkpoint_parse_metadata(mc_checkpoint_meta *meta, const char *text, size_t len,
                                        const char *source, const mc_gpt_config *base);
MC_API void mc_checkpoint_meta_destroy(mc_checkpoint_meta *meta);
/* The tensor of (kind, name), or NULL. */
MC_API const mc_checkpoint_tensor *mc_checkpoint_meta_find(const mc_checkpoint_meta *meta,
                                                           const char *kind, const char *name);

/* CRC-32 (IEEE 802.3, reflected 0xEDB88320, zlib's crc32): start with crc = 0 and feed the
   previous result to continue. mc_crc32(0, "123456789", 9) == 0xCBF43926. */
MC_API uint32_t mc_crc32(uint32_t crc, const void *data, size_t n);

/* @checkpoint:declarations end */

/* Deprecated spellings of three destroy functions (every module's lifecycle pair is now
   _init / _destroy); kept for code written against 0.1.0, to be removed in 0.3. */
#define mc_gpt_free mc_gpt_destroy
#define mc_param_table_free mc_param_table_destroy
#define mc_checkpoint_meta_free mc_checkpoint_meta_destroy

/* @theoretical_memory:declarations begin */
/* ---------------------------------------------------------------------------------------------
   >>training.theoretical_memory  The bytes every rank of a training run holds, from the config and the
   layout alone (Megatron-LM's training/theoretical_memory_usage.py, per pipeline stage). A pure
   function: no allocation, no communication, a handful of arithmetic whatever the sizes, so
   pretrain_gpt calls it before it allocates anything (and refuses a run that cannot fit) and
   `megatron_c memory` prints it.

       mc_memory_desc d = { .config = cfg, .data_parallel_size = 2, .num_microbatches = 8 };
       mc_memory_stage st;
       mc_memory_estimate(&d, 0, &st);    // stage 0: st.bytes[MC_MEMORY_PAPER][...],
                                          // st.terms[i].formula / .values / .bytes

   Symbols: s seq_length, b micro_batch_size, h hidden_size, a heads, F ffn_hidden_size, L layers,
   V padded vocabulary, Pm max_position_embeddings, t / p / v tensor / pipeline / virtual sizes,
   d data-parallel size, M micro-batches per DP rank, r the stage (pp rank).

   Every stage gets two models, each a list of terms (category, formula, the formula with this
   config's numbers, bytes per rank):

   paper: what Megatron-LM holds (Korthikanti et al. 2022, "Reducing Activation Recomputation in
   Large Transformer Models", Table 2 and section 4; Megatron's theoretical_memory_usage.py).
     P            parameters of one rank of the stage, counted exactly for this GPT (biases
                  included): Ls·((4h + 2F)·h + 3h + F)/t + Ls·6h per Ls = L/p layers, the word
                  embedding Vp·h/t and position embedding Pm·h on stage 0, the final norm 2h and
                  the output layer V·h/t (untied, or the tied copy when p > 1) on the last stage.
     parameters   e·P, e = 2 with bf16, else 4.
     gradients    4·P: Megatron accumulates and reduces a bf16 model's grads in fp32.
     optimizer    bf16: 12·P (fp32 main params, Adam m and v); fp32: 8·P (the params are the main
                  params); divided by d under the distributed optimizer (Megatron's 6 + 12/d
                  bytes per parameter with bf16).
     activations  per layer and micro-batch, 2-byte activations and 1-byte dropout masks:
                    no parallelism                   s·b·h·(34 + 5·a·s/h)
                    tensor parallel                  s·b·h·(10 + 24/t + 5·a·s/(h·t))
                    tensor + sequence parallel       s·b·h·(34 + 5·a·s/h)/t
                    selective recompute              the same without the 5·a·s/h term
                    full recompute                   2·s·b·h (/t with SP): only the layer input
                  34 = 16 tensors of s·b·h elements at 2 bytes + 2 masks, of which 10 are
                  replicated across TP without SP; 5 = 2 tensors of b·a·s·s at 2 bytes + 1 mask.
                  F != 4h: 34 becomes 18 + 4·F/h (Megatron's form). Without bf16 the same tensors
                  are fp32: 66 + 9·a·s/h (replicated 18). Full recompute, uniform: the input of
                  every group of recompute_num_layers layers; block: the first
                  recompute_num_layers layers of each chunk keep their input only.
                  Stage 0 adds the embedding's int64 token ids 8·s·b and its dropout mask s·b·h
                  (/t with SP); the last stage the inputs of the final norm and the output layer
                  2·e·s·b·h (/t with SP) and the fp32 logits 4·s·b·V/t: 4·s·b·h·(1 + V/h)/t with
                  bf16 and SP, the paper's term.
                  In flight at the peak (Megatron frees a micro-batch's activations in its
                  backward): no pipelining 1; 1F1B min(p - r, M) (the warmup + 1); interleaved
                  k = min(2·(p - r - 1) + (v - 1)·p + 1, M·v) chunk micro-batches of L/(p·v)
                  layers each, so stage 0 holds L·(1 + (p - 1)/(p·v)) layers' worth, the
                  paper's interleaving factor. The embedding and output terms count the first
                  and last chunk's share of those k (schedule table order).
     communication  0: a received activation is the next layer's saved input (counted above).

   implementation: what this library allocates through the op table (mc_gpt_init,
   mc_optimizer_init, the schedule, finalize), byte for byte: what the table's memory account
   (mc_memory_account) counts for the same run. e = 2 with bf16 (mc_gpt_desc.dtype), else 4.
     parameters   e·P' and gradients 4·P' (fp32), P' = the table's total, P plus the
                  distributed optimizer's padding (param starts at multiples of 64, bucket ends at
                  lcm(d, 128), the tied embedding in its own bucket).
     optimizer    Adam m and v, 8·P' (/d under the distributed optimizer), with bf16 also the
                  fp32 main params (4·P'), and the step's span tables: 16 bytes per grad-norm
                  span and sizeof(mc_adamw_span) per AdamW span (+ one of each) and the norm's
                  8 bytes. The spans are the params this rank steps (its DP shards) and sums in
                  the norm (replicas on TP rank 0 only): mc_memory_desc.tp_rank and dp_rank.
     activations  one arena per chunk and slot, allocated at init: n_slots (pretrain_gpt: the
                  most micro-batches a chunk of the stage holds at once,
                  mc_schedule_max_in_flight) x v arenas of the layers' caches (the attention
                  statistics of the table: the CPU keeps the probabilities), the layer inputs,
                  the tokens on stage 0, the logits, norm and loss buffers on the last stage;
                  plus one scratch arena per rank (backward buffers, TP scratch, recompute replay
                  caches). Every tensor of an arena starts at a multiple of 256 bytes.
     communication  the schedule's P2P receive buffers at their peak (each e·s·b·h/t' bytes,
                  t' = t under SP, else 1; held from receive to the backward that uses them) and
                  finalize's packed sequence-parallel grads.
   The two models differ most in activations: this library's caches are its own (LayerNorm
   outputs, q|k|v, GELU input and output, statistics) rather than Megatron's saved tensors, and
   its slots are per chunk: each chunk gets the most micro-batches it ever holds, which under
   interleaving is more than its share at the paper's peak.

   A category's bytes are its peak; a model's total is the sum of its categories (pretrain_gpt
   allocates everything but the communication buffers before training, so the run's peak of all
   categories at once is that sum). Every rank of a stage (its t x d ranks) holds the same but
   for the optimizer's span tables. */

/* The categories are mc_memory_category (>>core.ops), those of the memory accounting. */
typedef enum mc_memory_model {
    MC_MEMORY_PAPER = 0,            /* Megatron-LM, Korthikanti et al. 2022 */
    MC_MEMORY_IMPLEMENTATION,       /* this library's allocations */
    MC_MEMORY_MODEL_COUNT
} mc_memory_model;

/* Zero means default. */
typedef struct mc_memory_desc {
    mc_gpt_config config;           /* resolved or not; its layout fields give t, p, v, SP and
                                       recompute, and micro_batch_size b */
    int data_parallel_size;         /* d; default 1 */
    int num_microbatches;           /* M per data-parallel rank (the largest under ramp-up);
                                       default 1 */
    int distributed_optimizer;
    int bf16;                       /* the paper model's precision (this build computes fp32) */
    int n_slots;                    /* implementation: mc_gpt_desc.n_slots; default what
                                       pretrain_gpt passes, mc_schedule_max_in_flight of the
                                       stage */
    size_t bucket_size;             /* implementation: mc_gpt_desc.bucket_size (padding) */
    int tp_rank, dp_rank;           /* implementation: the rank within its stage (only the
                                       optimizer's span tables depend on it); default 0 */
    const mc_ops *ops;              /* implementation: the table (its attention statistics);
                                       default mc_ops_cpu() */
} mc_memory_desc;

#define MC_MEMORY_MAX_TERMS 24
#define MC_MEMORY_TEXT 256

typedef struct mc_memory_term {
    mc_memory_model model;
    mc_memory_category category;
    char name[48];                  /* "transformer layers" */
    char formula[MC_MEMORY_TEXT];   /* "34·s·b·h/t × L/p × min(p - r, M)" (UTF-8) */
    char values[MC_MEMORY_TEXT];    /* the same with this config's numbers */
    double bytes;                   /* per rank */
} mc_memory_term;

typedef struct mc_memory_stage {
    int pp_rank, pp;                /* this stage r of p */
    int ranks;                      /* ranks holding it: t x d */
    int layers;                     /* transformer layers on the stage (all chunks) */
    int chunks;                     /* v, or 1 */
    int embedding, output_layer;    /* the stage holds the embedding / the loss */
    double params;                  /* P, per rank */
    double params_padded;           /* P' (the implementation's table total) */
    double owned_params;            /* implementation: params with state on this rank */
    double owned_normed;            /* ... of them, those in this rank's grad norm */
    char params_formula[MC_MEMORY_TEXT], params_values[MC_MEMORY_TEXT];
    int in_flight;                  /* paper: (chunk) micro-batches held at the peak */
    char in_flight_formula[MC_MEMORY_TEXT], in_flight_values[MC_MEMORY_TEXT];
    int n_slots;                    /* implementation: activation slots per chunk */
    int p2p_buffers;                /* implementation: receive buffers at the peak */
    double bytes[MC_MEMORY_MODEL_COUNT][MC_MEMORY_CATEGORY_COUNT];
    double total[MC_MEMORY_MODEL_COUNT];
    int n_terms;
    mc_memory_term terms[MC_MEMORY_MAX_TERMS];
} mc_memory_stage;

/* The estimate of stage pp_rank (0 .. p-1). Validates like mc_gpt_init (every config rule,
   MC_ERR_INVALID_DESC with the report) and like the schedule (Megatron's interleaving rules on
   M), and d, M, n_slots >= 1. out is written only on success. */
MC_API int mc_memory_estimate(const mc_memory_desc *desc, int pp_rank, mc_memory_stage *out);
MC_API const char *mc_memory_model_name(int model);         /* "paper", "implementation" */
/* "1.50 GiB", "812.0 MiB", "96 B" (binary units) into buf; returns buf. */
MC_API char *mc_memory_format_bytes(char *buf, size_t cap, double bytes);

/* @theoretical_memory:declarations end */

#ifdef __cplusplus
}
#endif
#endif /* MEGATRON_C_H_INCLUDED */

/* ============================================================================================
   IMPLEMENTATION
   ============================================================================================ */
#if defined(MEGATRON_C_IMPLEMENTATION) && !defined(MEGATRON_C_IMPL_INCLUDED)
#define MEGATRON_C_IMPL_INCLUDED

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#if defined(MC_COMM_MPI)
#include <mpi.h>
#include <sched.h>   /* defines: sched_yield, used while polling MPI requests */
#endif

#ifndef MC_ASSERT
#include <assert.h>
#define MC_ASSERT(c) assert(c)
#endif

#if defined(__cplusplus)
#define MC__THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define MC__THREAD_LOCAL _Thread_local
#elif defined(__GNUC__)
#define MC__THREAD_LOCAL __thread
#else
#define MC__THREAD_LOCAL /* no thread-local storage: one error buffer per process */
#endif

#if defined(__GNUC__)
#define MC__PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define MC__PRINTF(fmt_index, first_arg)
#endif

#define MC__DEF(value, def) ((value) == 0 ? (def) : (value))
#define MC__COUNTOF(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MC__LOG_TAG "megatron_c"
#define MC__ERROR_LEN 1024
#define MC__DEFAULT_ORDER "tp-cp-ep-dp-pp"
#define MC__DEFAULT_TIMEOUT_S 30.0

/* =============================================================================================
   core (implementation) */

// ---------------------------------------------------------------------------------------------
// >>core.errors

typedef struct mc__globals {
    mc_logger logger;
    mc_allocator allocator;
} mc__globals;

static mc__globals mc__g;
static MC__THREAD_LOCAL char mc__last_error_text[MC__ERROR_LEN];

MC_API const char *mc_err_name(int status) {
    switch (status) {
#define MC__NAME_CASE(name, value, text) \
    case value: return "MC_" #name;
        MC_ERROR_MAP(MC__NAME_CASE)
#undef MC__NAME_CASE
        default: return "MC_ERR_UNKNOWN";
    }
}

MC_API const char *mc_strerror(int status) {
    switch (status) {
#define MC__TEXT_CASE(name, value, text) \
    case value: return text;
        MC_ERROR_MAP(MC__TEXT_CASE)
#undef MC__TEXT_CASE
        default: return "unknown status";
    }
}

MC_API const char *mc_last_error(void) { return mc__last_error_text; }

MC_API const char *mc_version_string(void) { return "0.1.0"; }

static void mc__vlog(uint32_t level, int item, uint32_t line, const char *file, const char *fmt,
                     va_list ap) {
    char text[MC__ERROR_LEN];
    if (!mc__g.logger.func) return;
    vsnprintf(text, sizeof text, fmt, ap);
    mc__g.logger.func(MC__LOG_TAG, level, item, text, line, file, mc__g.logger.user_data);
}

static void mc__log_at(uint32_t level, uint32_t line, const char *file, const char *fmt, ...)
    MC__PRINTF(4, 5);
static void mc__log_at(uint32_t level, uint32_t line, const char *file, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mc__vlog(level, 0, line, file, fmt, ap);
    va_end(ap);
}

/* Records the message as this thread's last error, hands it to the logger (level 1) and
   returns `status`, so that error paths read `return MC__FAIL(MC_ERR_X, "...", ...);`. */
static int mc__fail_at(int status, uint32_t line, const char *file, const char *fmt, ...)
    MC__PRINTF(4, 5);
static int mc__fail_at(int status, uint32_t line, const char *file, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mc__last_error_text, sizeof mc__last_error_text, fmt, ap);
    va_end(ap);
    if (mc__g.logger.func)
        mc__g.logger.func(MC__LOG_TAG, 1, status, mc__last_error_text, line, file,
                          mc__g.logger.user_data);
    return status;
}

#define MC__FAIL(status, ...) mc__fail_at((status), (uint32_t)__LINE__, __FILE__, __VA_ARGS__)

#if defined(MC_ENABLE_CUDA)
MC_API int mc__set_error(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mc__last_error_text, sizeof mc__last_error_text, fmt, ap);
    va_end(ap);
    if (mc__g.logger.func)
        mc__g.logger.func(MC__LOG_TAG, 1, status, mc__last_error_text, 0, "megatron_c_cuda.cu",
                          mc__g.logger.user_data);
    return status;
}
#endif
#define MC__INFO(...) mc__log_at(3, (uint32_t)__LINE__, __FILE__, __VA_ARGS__)
#define MC__WARN(...) mc__log_at(2, (uint32_t)__LINE__, __FILE__, __VA_ARGS__)

// ---------------------------------------------------------------------------------------------
// >>core.setup

MC_API int mc_setup(const mc_desc *desc) {
    if (!desc) {
        memset(&mc__g, 0, sizeof mc__g);
        return MC_OK;
    }
    if ((desc->allocator.alloc_fn == NULL) != (desc->allocator.free_fn == NULL))
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_desc.allocator: alloc_fn (%s) and free_fn (%s) must be given together",
                        desc->allocator.alloc_fn ? "set" : "NULL",
                        desc->allocator.free_fn ? "set" : "NULL");
    mc__g.logger = desc->logger;
    mc__g.allocator = desc->allocator;
    return MC_OK;
}

MC_API void *mc_malloc(size_t size) {
    if (size == 0) size = 1;   /* a unique pointer even for empty arrays */
    if (mc__g.allocator.alloc_fn) return mc__g.allocator.alloc_fn(size, mc__g.allocator.user_data);
    return malloc(size);
}

MC_API void *mc_calloc(size_t count, size_t size) {
    void *p;
    size_t bytes;
    if (size != 0 && count > (size_t)-1 / size) return NULL;
    bytes = count * size;
    p = mc_malloc(bytes);
    if (p) memset(p, 0, bytes > 0 ? bytes : 1);
    return p;
}

MC_API void mc_free(void *ptr) {
    if (!ptr) return;
    if (mc__g.allocator.free_fn)
        mc__g.allocator.free_fn(ptr, mc__g.allocator.user_data);
    else
        free(ptr);
}

#if defined(MC_FAULT_HOOKS)
// ---------------------------------------------------------------------------------------------
// >>core.faults  (the list is at the declaration)

static mc_fault_desc mc__fault;
static char mc__fault_param[MC_PARAM_NAME_MAX];

MC_API void mc_fault_inject(const mc_fault_desc *desc) {
    memset(&mc__fault, 0, sizeof mc__fault);
    mc__fault_param[0] = '\0';
    if (!desc || desc->kind == MC_FAULT_OFF) return;
    mc__fault = *desc;
    if (desc->param) snprintf(mc__fault_param, sizeof mc__fault_param, "%s", desc->param);
    mc__fault.param = mc__fault_param;
    if (mc__fault.factor == 0.0f) mc__fault.factor = 1.0f;
}

/* The fault `kind` is set for this layer and submodule. */
static int mc__fault_at(mc_fault_kind kind, int layer, int submodule) {
    return mc__fault.kind == kind && mc__fault.layer == layer && mc__fault.submodule == submodule;
}

/* The fault `kind` is set for the parameter `name` (a prefix match). */
static int mc__fault_on_param(mc_fault_kind kind, const char *name) {
    size_t n = strlen(mc__fault_param);
    return mc__fault.kind == kind && n > 0 && strncmp(name, mc__fault_param, n) == 0;
}
#endif

// FNV-1a (64 bit): the fingerprints of the group plan, the config and the init streams.

#define MC__FNV_OFFSET 14695981039346656037ULL
#define MC__FNV_PRIME 1099511628211ULL

static uint64_t mc__fnv_bytes(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= p[i];
        h *= MC__FNV_PRIME;
    }
    return h;
}

/* Hashes the value as 8 little-endian bytes, so the fingerprint does not depend on the host. */
static uint64_t mc__fnv_int(uint64_t h, uint64_t v) {
    unsigned char b[8];
    int i;
    for (i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    return mc__fnv_bytes(h, b, 8);
}


/* The Philox block and its uniform (>>tensor_parallel.random): the CPU dropout ops draw from
   them too. */
static void mc__rng_block(uint64_t seed, uint64_t block, uint32_t out[4]);
static float mc__rng_to_uniform(uint32_t bits);

/* @ops:implementation begin */
// ---------------------------------------------------------------------------------------------
// >>core.ops cpu  The CPU reference op table: plain loops over fp32 arrays, every sum in a fixed
// order. Element-wise and row-wise ops follow llm.c's formulas; the shapes are in each
// function's comment ([rows, cols], row-major). bf16 tensors are converted to fp32 copies, the
// fp32 loop runs, and bf16 results are rounded back (nearest-even): the same fp32 math, bf16
// storage.

#include <math.h>
#if defined(MC_USE_CBLAS) && !defined(MC_WITH_CBLAS)
#define MC_WITH_CBLAS
#endif
#if defined(MC_WITH_CBLAS)
#include <cblas.h>
#endif

#if defined(__GNUC__) || defined(_MSC_VER)
#define MC__RESTRICT __restrict
#else
#define MC__RESTRICT
#endif

MC_API mc_bf16 mc_bf16_from_float(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (mc_bf16)((u >> 16) | 0x0040u);   /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);   /* round to nearest, ties to even */
    return (mc_bf16)(u >> 16);
}

MC_API float mc_bf16_to_float(mc_bf16 x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

MC_API size_t mc_dtype_bytes(mc_dtype dt, size_t n) { return mc_dtype_size(dt) * n; }

MC_API int mc_ops_same_memory(const mc_ops *a, const mc_ops *b) {
    if (!a || !b) return 0;
    return a == b || (a->device == b->device && a->ctx == b->ctx);
}

/* Floating-point storage the ops accept for activations and parameters. */
static int mc__cpu_check_dt(const char *op, mc_dtype dt) {
    if (dt == MC_F32 || dt == MC_BF16) return MC_OK;
    return MC__FAIL(MC_ERR_INVALID_ARG, "cpu %s: dtype (%d) must be MC_F32 or MC_BF16", op,
                    (int)dt);
}

/* An fp32 view of n elements of x: x itself for MC_F32, a converted copy for MC_BF16. `load`
   reads the values (inputs, accumulated outputs); put(store = 1) rounds the copy back. */
typedef struct mc__f32 {
    float *p;
    void *orig;
    size_t n;
    int owned;
} mc__f32;

static int mc__f32_get(mc__f32 *t, const void *x, size_t n, mc_dtype dt, int load,
                       const char *op) {
    size_t i;
    t->orig = (void *)(uintptr_t)x;
    t->n = n;
    t->owned = 0;
    t->p = (float *)(uintptr_t)x;
    if (!x || dt == MC_F32) return MC_OK;
    if (dt != MC_BF16) return mc__cpu_check_dt(op, dt);
    t->p = (float *)mc_malloc((n > 0 ? n : 1) * sizeof(float));
    if (!t->p)
        return MC__FAIL(MC_ERR_NO_MEMORY, "cpu %s: no memory for an fp32 copy of %zu bf16 values",
                        op, n);
    t->owned = 1;
    if (load)
        for (i = 0; i < n; i++) t->p[i] = mc_bf16_to_float(((const mc_bf16 *)x)[i]);
    return MC_OK;
}

static void mc__f32_put(mc__f32 *t, int store) {
    size_t i;
    if (!t->owned) return;
    if (store)
        for (i = 0; i < t->n; i++) ((mc_bf16 *)t->orig)[i] = mc_bf16_from_float(t->p[i]);
    mc_free(t->p);
    t->owned = 0;
}

/* Up to 8 views taken together and released together: every op below is "get the views, run
   the fp32 loop, put them back". */
typedef struct mc__f32_set {
    mc__f32 v[8];
    int store[8];
    int n;
} mc__f32_set;

static float *mc__f32_add(mc__f32_set *s, int *rc, const void *x, size_t n, mc_dtype dt,
                          int load, int store, const char *op) {
    mc__f32 *t = &s->v[s->n];
    if (*rc != MC_OK) return NULL;
    MC_ASSERT(s->n < 8);
    *rc = mc__f32_get(t, x, n, dt, load, op);
    if (*rc != MC_OK) return NULL;
    s->store[s->n++] = store;
    return t->p;
}

static int mc__f32_done(mc__f32_set *s, int rc) {
    int i;
    for (i = s->n - 1; i >= 0; i--) mc__f32_put(&s->v[i], rc == MC_OK && s->store[i]);
    s->n = 0;
    return rc;
}

#define MC__F32_SET_EMPTY {{{NULL, NULL, 0, 0}}, {0}, 0}
#define MC__IN 1, 0    /* read, not written back */
#define MC__OUT 0, 1   /* written (=) */
#define MC__ACC 1, 1   /* read and written (+=) */

// memory

static int mc__cpu_alloc(const mc_ops *o, void **ptr, size_t bytes) {
    (void)o;
    if (!ptr) return MC__FAIL(MC_ERR_INVALID_ARG, "cpu alloc: ptr is NULL");
    *ptr = mc_calloc(1, bytes);
    if (!*ptr) return MC__FAIL(MC_ERR_NO_MEMORY, "cpu alloc: out of memory (%zu bytes)", bytes);
    return MC_OK;
}

static int mc__cpu_free(const mc_ops *o, void *ptr) {
    (void)o;
    mc_free(ptr);
    return MC_OK;
}

static int mc__cpu_copy_bytes(const mc_ops *o, void *dst, const void *src, size_t bytes) {
    (void)o;
    if (bytes && dst != src) memmove(dst, src, bytes);
    return MC_OK;
}

static int mc__cpu_copy_2d(const mc_ops *o, void *dst, size_t dst_pitch, const void *src,
                           size_t src_pitch, size_t width, size_t rows) {
    size_t r;
    (void)o;
    if (width == 0 || rows == 0) return MC_OK;
    if (!dst || !src)
        return MC__FAIL(MC_ERR_INVALID_ARG, "cpu copy_2d: dst and src must be set (%zu rows of "
                        "%zu bytes)", rows, width);
    if (dst_pitch == width && src_pitch == width) {
        memmove(dst, src, width * rows);
        return MC_OK;
    }
    for (r = 0; r < rows; r++)
        memmove((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
    return MC_OK;
}

static int mc__cpu_synchronize(const mc_ops *o) {
    (void)o;
    return MC_OK;
}

// ---------------------------------------------------------------------------------------------
// >>core.ops cpu element-wise

static void mc__cpu_fill_f32(float *x, float value, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) x[i] = value;
}

static int mc__cpu_fill(const mc_ops *o, void *x, float value, size_t n, mc_dtype dt) {
    size_t i;
    (void)o;
    if (dt == MC_F32) {
        mc__cpu_fill_f32((float *)x, value, n);
    } else if (dt == MC_BF16) {
        mc_bf16 b = mc_bf16_from_float(value);
        for (i = 0; i < n; i++) ((mc_bf16 *)x)[i] = b;
    } else {
        return mc__cpu_check_dt("fill", dt);
    }
    return MC_OK;
}

static int mc__cpu_copy(const mc_ops *o, void *dst, const void *src, size_t n, mc_dtype dst_dt,
                        mc_dtype src_dt) {
    size_t i;
    int rc;
    if ((rc = mc__cpu_check_dt("copy", dst_dt)) != MC_OK) return rc;
    if ((rc = mc__cpu_check_dt("copy", src_dt)) != MC_OK) return rc;
    if (dst_dt == src_dt) return mc__cpu_copy_bytes(o, dst, src, mc_dtype_bytes(dst_dt, n));
    if (dst_dt == MC_BF16)
        for (i = 0; i < n; i++) ((mc_bf16 *)dst)[i] = mc_bf16_from_float(((const float *)src)[i]);
    else
        for (i = 0; i < n; i++) ((float *)dst)[i] = mc_bf16_to_float(((const mc_bf16 *)src)[i]);
    return MC_OK;
}

static void mc__cpu_axpy_f32(float *y, float a, const float *x, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) y[i] += a * x[i];
}

static int mc__cpu_axpy(const mc_ops *o, void *y, float a, const void *x, size_t n,
                        mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK;
    float *fy = mc__f32_add(&s, &rc, y, n, dt, MC__ACC, "axpy");
    const float *fx = x == y ? fy : mc__f32_add(&s, &rc, x, n, dt, MC__IN, "axpy");
    (void)o;
    if (rc == MC_OK) mc__cpu_axpy_f32(fy, a, fx, n);
    return mc__f32_done(&s, rc);
}

static int mc__cpu_scale(const mc_ops *o, void *x, float a, size_t n, mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK;
    float *fx = mc__f32_add(&s, &rc, x, n, dt, MC__ACC, "scale");
    size_t i;
    (void)o;
    if (rc == MC_OK)
        for (i = 0; i < n; i++) fx[i] *= a;
    return mc__f32_done(&s, rc);
}

static int mc__cpu_sum_squares(const mc_ops *o, double *out, const float *x, const size_t *spans,
                               int n_spans) {
    double s = 0.0;
    size_t i;
    int k;
    (void)o;
    if (!out) return MC__FAIL(MC_ERR_INVALID_ARG, "cpu sum_squares: out is NULL");
    for (k = 0; k < n_spans; k++)
        for (i = spans[2 * k]; i < spans[2 * k + 1]; i++) s += (double)x[i] * (double)x[i];
    *out = s;
    return MC_OK;
}
// ---------------------------------------------------------------------------------------------
// >>core.ops cpu gemm
//
// C is computed in blocks of MB x NB. For each block an accumulator acc[MB, NB] starts at zero
// and K is walked in KB-deep slices, in order: the slice of op(A) is copied ("packed") into
// Ap[MB, KB] and that of op(B) into Bp[KB, NB], whatever the transposes, so the kernel's
// inner loop runs over contiguous columns of Bp and acc (it vectorizes) and the blocks stay
// in cache (Bp is 64 KiB). Every acc element receives its K products in the order
// k = 0 .. K-1, whatever the block sizes: the result of an element depends only on its row of
// op(A), its column of op(B) and K. Finally C = alpha * acc + beta * C.

#define MC__GEMM_MB 32
#define MC__GEMM_NB 128
#define MC__GEMM_KB 128

#if defined(MC_CPU_GEMM_ACC_F64)
typedef double mc__gemm_acc;
#else
typedef float mc__gemm_acc;
#endif

/* Ap[mb, kb] = op(A)[i0 .., k0 ..]; op(A) is A[M,K], or A^T with A stored [K,M]. */
static void mc__gemm_pack_a(float *MC__RESTRICT Ap, const float *MC__RESTRICT A, int M, int K,
                            int trans_a, int i0, int mb, int k0, int kb) {
    int i, k;
    if (!trans_a) {
        for (i = 0; i < mb; i++)
            for (k = 0; k < kb; k++) Ap[i * kb + k] = A[(size_t)(i0 + i) * K + (k0 + k)];
    } else {
        for (k = 0; k < kb; k++)   /* read rows of the stored [K,M] matrix */
            for (i = 0; i < mb; i++) Ap[i * kb + k] = A[(size_t)(k0 + k) * M + (i0 + i)];
    }
}

/* Bp[kb, NB] = op(B)[k0 .., j0 .. j0 + nb], zero beyond nb so that the kernel always runs
   full-width rows; op(B) is B[K,N], or B^T with B stored [N,K]. */
static void mc__gemm_pack_b(float *MC__RESTRICT Bp, const float *MC__RESTRICT B, int N, int K,
                            int trans_b, int k0, int kb, int j0, int nb) {
    int j, k;
    if (nb < MC__GEMM_NB) memset(Bp, 0, sizeof(float) * (size_t)kb * MC__GEMM_NB);
    if (!trans_b) {
        for (k = 0; k < kb; k++)
            for (j = 0; j < nb; j++) Bp[k * MC__GEMM_NB + j] = B[(size_t)(k0 + k) * N + (j0 + j)];
    } else {
        for (j = 0; j < nb; j++)   /* read rows of the stored [N,K] matrix */
            for (k = 0; k < kb; k++) Bp[k * MC__GEMM_NB + j] = B[(size_t)(j0 + j) * K + (k0 + k)];
    }
}

/* acc[mb, NB] += Ap[mb, kb] Bp[kb, NB]. The rows have the fixed width NB (a trip count the
   compiler knows, so the j loop vectorizes even at -O2). Four k at a time share one pass over
   an acc row; each element still adds its products in k order, so the unrolling changes no
   bit. */
static void mc__gemm_kernel(mc__gemm_acc *MC__RESTRICT acc, const float *MC__RESTRICT Ap,
                            const float *MC__RESTRICT Bp, int mb, int kb) {
    int i, j, k;
    for (i = 0; i < mb; i++) {
        mc__gemm_acc *MC__RESTRICT c = acc + (size_t)i * MC__GEMM_NB;
        const float *a = Ap + (size_t)i * kb;
        for (k = 0; k + 4 <= kb; k += 4) {
            const float a0 = a[k], a1 = a[k + 1], a2 = a[k + 2], a3 = a[k + 3];
            const float *b0 = Bp + (size_t)k * MC__GEMM_NB, *b1 = b0 + MC__GEMM_NB;
            const float *b2 = b1 + MC__GEMM_NB, *b3 = b2 + MC__GEMM_NB;
            for (j = 0; j < MC__GEMM_NB; j++) {
                mc__gemm_acc s = c[j];
                s += (mc__gemm_acc)(a0 * b0[j]);
                s += (mc__gemm_acc)(a1 * b1[j]);
                s += (mc__gemm_acc)(a2 * b2[j]);
                s += (mc__gemm_acc)(a3 * b3[j]);
                c[j] = s;
            }
        }
        for (; k < kb; k++) {
            const float ak = a[k];
            const float *bk = Bp + (size_t)k * MC__GEMM_NB;
            for (j = 0; j < MC__GEMM_NB; j++) c[j] += (mc__gemm_acc)(ak * bk[j]);
        }
    }
}

/* The rows [ilo, ihi) and columns [jlo, jhi) of C (block-aligned or not: each element's sum
   is the same either way), so that threads can share one product. */
static void mc__gemm_blocked_range(float *C, const float *A, const float *B, int M, int N, int K,
                                   int trans_a, int trans_b, float alpha, float beta, int ilo,
                                   int ihi, int jlo, int jhi) {
    float Ap[MC__GEMM_MB * MC__GEMM_KB];
    float Bp[MC__GEMM_KB * MC__GEMM_NB];
    mc__gemm_acc acc[MC__GEMM_MB * MC__GEMM_NB];
    int i0, j0, k0, i, j;
    for (i0 = ilo; i0 < ihi; i0 += MC__GEMM_MB) {
        const int mb = ihi - i0 < MC__GEMM_MB ? ihi - i0 : MC__GEMM_MB;
        for (j0 = jlo; j0 < jhi; j0 += MC__GEMM_NB) {
            const int nb = jhi - j0 < MC__GEMM_NB ? jhi - j0 : MC__GEMM_NB;
            for (i = 0; i < mb * MC__GEMM_NB; i++) acc[i] = 0;
            for (k0 = 0; k0 < K; k0 += MC__GEMM_KB) {
                const int kb = K - k0 < MC__GEMM_KB ? K - k0 : MC__GEMM_KB;
                mc__gemm_pack_a(Ap, A, M, K, trans_a, i0, mb, k0, kb);
                mc__gemm_pack_b(Bp, B, N, K, trans_b, k0, kb, j0, nb);
                mc__gemm_kernel(acc, Ap, Bp, mb, kb);
            }
            for (i = 0; i < mb; i++) {
                float *c = C + (size_t)(i0 + i) * N + j0;
                const mc__gemm_acc *s = acc + (size_t)i * MC__GEMM_NB;
                if (beta == 0.0f)   /* C is not read: it may hold garbage or NaN */
                    for (j = 0; j < nb; j++) c[j] = alpha * (float)s[j];
                else
                    for (j = 0; j < nb; j++) c[j] = alpha * (float)s[j] + beta * c[j];
            }
        }
    }
}

MC_API void mc_cpu_gemm_blocked(float *C, const float *A, const float *B, int M, int N, int K,
                                int trans_a, int trans_b, float alpha, float beta) {
    mc__gemm_blocked_range(C, A, B, M, N, K, trans_a, trans_b, alpha, beta, 0, M, 0, N);
}

#if defined(MC_WITH_CBLAS)
static void mc__cpu_gemm_cblas(float *C, const float *A, const float *B, int M, int N, int K,
                               int trans_a, int trans_b, float alpha, float beta) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   /* some BLAS builds reject K = 0 with ldb = 0 */
        mc_cpu_gemm_blocked(C, A, B, M, N, K, trans_a, trans_b, alpha, beta);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, trans_a ? M : K, B,
                trans_b ? K : N, beta, C, N);
}
#endif
/* The reference table always runs the blocked kernel (mc_ops_cpu_cblas and the fast table may
   take a BLAS). */
#define MC__CPU_GEMM mc_cpu_gemm_blocked

// ---------------------------------------------------------------------------------------------
/* out[N,C] += bias[C] */
static void mc__cpu_add_bias_f32(float *out, const float *bias, int N, int C) {
    int n, c;
    if (!bias) return;
    for (n = 0; n < N; n++)
        for (c = 0; c < C; c++) out[(size_t)n * C + c] += bias[c];
}

typedef void (*mc__gemm_f32_fn)(float *C, const float *A, const float *B, int M, int N, int K,
                                int trans_a, int trans_b, float alpha, float beta);
typedef void (*mc__add_bias_fn)(float *out, const float *bias, int N, int C);

/* The table's gemm around an fp32 kernel: checks, the fp32 views of bf16 operands, the bias. */
static int mc__cpu_gemm_with(mc__gemm_f32_fn gemm, mc__add_bias_fn add_bias, void *C,
                             const void *A, const void *B, const void *bias, int M, int N, int K,
                             int trans_a, int trans_b, float alpha, float beta, mc_dtype c_dt,
                             mc_dtype ab_dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK;
    size_t mk = (size_t)(M > 0 ? M : 0) * (size_t)(K > 0 ? K : 0);
    size_t kn = (size_t)(K > 0 ? K : 0) * (size_t)(N > 0 ? N : 0);
    size_t mn = (size_t)(M > 0 ? M : 0) * (size_t)(N > 0 ? N : 0);
    float *fc, *fa, *fb, *fbias;
    if (M < 0 || N < 0 || K < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "cpu gemm: M (%d), N (%d) and K (%d) must be >= 0", M,
                        N, K);
    if (M == 0 || N == 0) return MC_OK;
    fc = mc__f32_add(&s, &rc, C, mn, c_dt, beta != 0.0f, 1, "gemm");
    fa = mc__f32_add(&s, &rc, A, mk, ab_dt, MC__IN, "gemm");
    fb = mc__f32_add(&s, &rc, B, kn, ab_dt, MC__IN, "gemm");
    fbias = mc__f32_add(&s, &rc, bias, (size_t)N, ab_dt, MC__IN, "gemm");
    if (rc == MC_OK) {
        gemm(fc, fa, fb, M, N, K, trans_a, trans_b, alpha, beta);
        add_bias(fc, fbias, M, N);
    }
    return mc__f32_done(&s, rc);
}

static int mc__cpu_gemm(const mc_ops *o, void *C, const void *A, const void *B, const void *bias,
                        int M, int N, int K, int trans_a, int trans_b, float alpha, float beta,
                        mc_dtype c_dt, mc_dtype ab_dt) {
    (void)o;
    return mc__cpu_gemm_with(MC__CPU_GEMM, mc__cpu_add_bias_f32, C, A, B, bias, M, N, K, trans_a,
                             trans_b, alpha, beta, c_dt, ab_dt);
}

#if defined(MC_WITH_CBLAS)
static int mc__cpu_gemm_cblas_op(const mc_ops *o, void *C, const void *A, const void *B,
                                 const void *bias, int M, int N, int K, int trans_a, int trans_b,
                                 float alpha, float beta, mc_dtype c_dt, mc_dtype ab_dt) {
    (void)o;
    return mc__cpu_gemm_with(mc__cpu_gemm_cblas, mc__cpu_add_bias_f32, C, A, B, bias, M, N, K,
                             trans_a, trans_b, alpha, beta, c_dt, ab_dt);
}
#endif

// ---------------------------------------------------------------------------------------------
// >>core.ops cpu bias, layernorm, gelu

/* dbias[C] += sum over rows of dout[N,C] (rows in order) */
static int mc__cpu_bias_backward(const mc_ops *o, float *dbias, const void *dout, int N, int C,
                                 mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK, n, c;
    const float *dy = mc__f32_add(&s, &rc, dout, (size_t)N * C, dt, MC__IN, "bias_backward");
    (void)o;
    if (rc == MC_OK)
        for (n = 0; n < N; n++)
            for (c = 0; c < C; c++) dbias[c] += dy[(size_t)n * C + c];
    return mc__f32_done(&s, rc);
}

/* out[N,C], mean[N], rstd[N] <- inp[N,C], weight[C], bias[C] */
static void mc__cpu_layernorm_forward_f32(float *out, float *mean, float *rstd, const float *inp,
                                          const float *weight, const float *bias, int N, int C,
                                          float eps) {
    int n, c;
    for (n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float m = 0.0f, v = 0.0f, s;
        for (c = 0; c < C; c++) m += x[c];
        m /= (float)C;
        for (c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= (float)C;
        s = 1.0f / sqrtf(v + eps);
        for (c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + (bias ? bias[c] : 0.0f);
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = s;
    }
}

static int mc__cpu_layernorm_forward(const mc_ops *o, void *out, float *mean, float *rstd,
                                     const void *inp, const void *weight, const void *bias, int N,
                                     int C, float eps, mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK;
    size_t nc = (size_t)N * C;
    float *y = mc__f32_add(&s, &rc, out, nc, dt, MC__OUT, "layernorm_forward");
    const float *x = mc__f32_add(&s, &rc, inp, nc, dt, MC__IN, "layernorm_forward");
    const float *w = mc__f32_add(&s, &rc, weight, (size_t)C, dt, MC__IN, "layernorm_forward");
    const float *b = mc__f32_add(&s, &rc, bias, (size_t)C, dt, MC__IN, "layernorm_forward");
    (void)o;
    if (rc == MC_OK) mc__cpu_layernorm_forward_f32(y, mean, rstd, x, w, b, N, C, eps);
    return mc__f32_done(&s, rc);
}

/* dinp[N,C] +=, dweight[C] +=, dbias[C] += (may be NULL) <- dout[N,C], inp[N,C], weight[C],
   mean[N], rstd[N]. With xhat = (x - mean) * rstd and g = weight * dout:
   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
static void mc__cpu_layernorm_backward_f32(float *dinp, float *dweight, float *dbias,
                                           const float *dout, const float *inp,
                                           const float *weight, const float *mean,
                                           const float *rstd, int N, int C) {
    int n, c;
    for (n = 0; n < N; n++) {
        const float *dy = dout + (size_t)n * C, *x = inp + (size_t)n * C;
        float *dx = dinp ? dinp + (size_t)n * C : NULL;
        const float m = mean[n], s = rstd[n];
        float g_mean = 0.0f, g_xhat_mean = 0.0f;
        for (c = 0; c < C; c++) {
            const float xhat = (x[c] - m) * s, g = weight[c] * dy[c];
            g_mean += g;
            g_xhat_mean += g * xhat;
        }
        g_mean /= (float)C;
        g_xhat_mean /= (float)C;
        for (c = 0; c < C; c++) {
            const float xhat = (x[c] - m) * s, g = weight[c] * dy[c];
            if (dbias) dbias[c] += dy[c];
            if (dweight) dweight[c] += xhat * dy[c];
            if (dx) dx[c] += (g - g_mean - xhat * g_xhat_mean) * s;
        }
    }
}

static int mc__cpu_layernorm_backward(const mc_ops *o, void *dinp, float *dweight, float *dbias,
                                      const void *dout, const void *inp, const void *weight,
                                      const float *mean, const float *rstd, int N, int C,
                                      mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK;
    size_t nc = (size_t)N * C;
    float *dx = mc__f32_add(&s, &rc, dinp, nc, dt, MC__ACC, "layernorm_backward");
    const float *dy = mc__f32_add(&s, &rc, dout, nc, dt, MC__IN, "layernorm_backward");
    const float *x = mc__f32_add(&s, &rc, inp, nc, dt, MC__IN, "layernorm_backward");
    const float *w = mc__f32_add(&s, &rc, weight, (size_t)C, dt, MC__IN, "layernorm_backward");
    (void)o;
    if (rc == MC_OK) mc__cpu_layernorm_backward_f32(dx, dweight, dbias, dy, x, w, mean, rstd, N, C);
    return mc__f32_done(&s, rc);
}

#define MC__GELU_SCALE 0.7978845608028654f   /* sqrt(2 / pi) */
#define MC__GELU_CUBIC 0.044715f

static int mc__cpu_gelu_forward(const mc_ops *o, void *out, const void *inp, size_t n,
                                mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK;
    float *y = mc__f32_add(&s, &rc, out, n, dt, MC__OUT, "gelu_forward");
    const float *x = inp == out ? NULL : mc__f32_add(&s, &rc, inp, n, dt, MC__IN, "gelu_forward");
    size_t i;
    (void)o;
    if (rc != MC_OK) return mc__f32_done(&s, rc);
    if (inp == out) {   /* in place: the output view must hold the input first */
        if (dt == MC_BF16)
            for (i = 0; i < n; i++) y[i] = mc_bf16_to_float(((const mc_bf16 *)inp)[i]);
        x = y;
    }
    for (i = 0; i < n; i++) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(MC__GELU_SCALE * (v + MC__GELU_CUBIC * v * v * v)));
    }
    return mc__f32_done(&s, rc);
}

/* dinp = dout * d/dx gelu(x); tanh' = 1 - tanh^2 (no cosh, which overflows for large x) */
static int mc__cpu_gelu_backward(const mc_ops *o, void *dinp, const void *inp, const void *dout,
                                 size_t n, mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK;
    const float *x = mc__f32_add(&s, &rc, inp, n, dt, MC__IN, "gelu_backward");
    const float *dy = mc__f32_add(&s, &rc, dout, n, dt, MC__IN, "gelu_backward");
    float *dx = mc__f32_add(&s, &rc, dinp, n, dt, MC__OUT, "gelu_backward");
    size_t i;
    (void)o;
    if (rc == MC_OK)
        for (i = 0; i < n; i++) {
            const float v = x[i];
            const float t = tanhf(MC__GELU_SCALE * (v + MC__GELU_CUBIC * v * v * v));
            const float dtanh =
                (1.0f - t * t) * MC__GELU_SCALE * (1.0f + 3.0f * MC__GELU_CUBIC * v * v);
            dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dtanh);
        }
    return mc__f32_done(&s, rc);
}

/* The fused MLP ops as their composition through the table (o->gemm may be a BLAS): exactly
   the numbers of gemm then gelu. */
static int mc__cpu_gemm_gelu_forward(const mc_ops *o, void *out, void *pre, const void *A,
                                     const void *B, const void *bias, int M, int N, int K,
                                     int trans_a, int trans_b, mc_dtype dt) {
    int rc = o->gemm(o, pre, A, B, bias, M, N, K, trans_a, trans_b, 1.0f, 0.0f, dt, dt);
    if (rc != MC_OK) return rc;
    return o->gelu_forward(o, out, pre, (size_t)(M > 0 ? M : 0) * (size_t)(N > 0 ? N : 0), dt);
}

/* dpre first holds the product (rounded to dt as the unfused path stores it), then in place
   gelu'(pre) times it. */
static int mc__cpu_gemm_gelu_backward(const mc_ops *o, void *dpre, const void *pre, const void *A,
                                      const void *B, int M, int N, int K, int trans_a,
                                      int trans_b, mc_dtype dt) {
    int rc = o->gemm(o, dpre, A, B, NULL, M, N, K, trans_a, trans_b, 1.0f, 0.0f, dt, dt);
    if (rc != MC_OK) return rc;
    return o->gelu_backward(o, dpre, pre, dpre, (size_t)(M > 0 ? M : 0) * (size_t)(N > 0 ? N : 0),
                            dt);
}

// ---------------------------------------------------------------------------------------------
// >>core.ops cpu dropout  (the keep rule of mc_rng_dropout_mask, element by element)

/* Keeps the last Philox block, so a run of consecutive indices costs one block per four. */
typedef struct mc__keep_cache {
    uint64_t seed;
    uint64_t block;
    int valid;
    uint32_t bits[4];
} mc__keep_cache;

static void mc__keep_cache_init(mc__keep_cache *kc, uint64_t seed) {
    memset(kc, 0, sizeof *kc);
    kc->seed = seed;
}

/* 1 iff element `index` of the stream is kept under drop probability p (> 0). */
static int mc__keep(mc__keep_cache *kc, uint64_t index, float p) {
    if (!kc->valid || index / 4 != kc->block) {
        kc->block = index / 4;
        kc->valid = 1;
        mc__rng_block(kc->seed, kc->block, kc->bits);
    }
    return mc__rng_to_uniform(kc->bits[index % 4]) >= p;
}

/* 1 / (1 - p), or 0 when everything is dropped (p >= 1) */
static float mc__dropout_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

/* out[i] = inp[i] * keep(offset + i) / (1 - p); also the backward (same mask, same scale).
   bf16: a kept value times the scale is rounded once, a dropped one is 0. */
static int mc__cpu_dropout_apply(void *out, const void *inp, size_t n, float p, uint64_t seed,
                                 uint64_t offset, mc_dtype dt) {
    mc__keep_cache kc;
    const float scale = mc__dropout_scale(p);
    size_t i;
    int rc;
    if ((rc = mc__cpu_check_dt("dropout", dt)) != MC_OK) return rc;
    if (p <= 0.0f) {
        if (out != inp) memmove(out, inp, mc_dtype_bytes(dt, n));
        return MC_OK;
    }
    mc__keep_cache_init(&kc, seed);
    if (dt == MC_F32) {
        const float *x = (const float *)inp;
        float *y = (float *)out;
        for (i = 0; i < n; i++) y[i] = mc__keep(&kc, offset + i, p) ? x[i] * scale : 0.0f;
    } else {
        const mc_bf16 *x = (const mc_bf16 *)inp;
        mc_bf16 *y = (mc_bf16 *)out;
        for (i = 0; i < n; i++)
            y[i] = mc_bf16_from_float(mc__keep(&kc, offset + i, p) ? mc_bf16_to_float(x[i]) * scale
                                                                   : 0.0f);
    }
    return MC_OK;
}

static int mc__cpu_dropout_forward(const mc_ops *o, void *out, const void *inp, size_t n, float p,
                                   uint64_t seed, uint64_t offset, mc_dtype dt) {
    (void)o;
    return mc__cpu_dropout_apply(out, inp, n, p, seed, offset, dt);
}

static int mc__cpu_dropout_backward(const mc_ops *o, void *dinp, const void *dout, size_t n,
                                    float p, uint64_t seed, uint64_t offset, mc_dtype dt) {
    (void)o;
    return mc__cpu_dropout_apply(dinp, dout, n, p, seed, offset, dt);
}

// ---------------------------------------------------------------------------------------------
// >>core.ops cpu attention
//
// Row t of head h in sequence b: scores[t2] = q_t . k_t2 / sqrt(HD) for t2 <= t (causal),
// P = softmax(scores), D = P * mask / (1 - p) (dropout), out_t = sum_t2 D[t2] v_t2.
// Token (s, b) is row s*B + b of qkv [S*B, NH*3*HD]; head h's q, k, v start at columns
// h*3*HD, h*3*HD + HD, h*3*HD + 2*HD. The CPU's stats are the probabilities P [B,NH,S,S].

/* Weight of v_t2 in out_t: P, dropped and rescaled when p > 0. */
static float mc__attn_weight(mc__keep_cache *kc, float prob, uint64_t index, float p,
                             float keep_scale) {
    if (p <= 0.0f) return prob;
    return mc__keep(kc, index, p) ? prob * keep_scale : 0.0f;
}

static float mc__dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    int i;
    for (i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static size_t mc__cpu_attention_stats(const mc_ops *o, int S, int B, int NH, int HD) {
    (void)o;
    (void)HD;
    return (size_t)B * (size_t)NH * (size_t)S * (size_t)S;
}

/* One (sequence b, head h) of the forward: its rows of out and its [S,S] block of probs.
   Different (b, h) write disjoint memory, so they may run in any order or at once. */
static void mc__cpu_attention_forward_bh(float *out, float *probs, const float *qkv, int S,
                                         int B, int NH, int HD, float dropout_p, uint64_t seed,
                                         uint64_t offset, int b, int h) {
    const size_t C3 = (size_t)NH * 3 * HD, C = (size_t)NH * HD;
    const float scale = 1.0f / sqrtf((float)HD), keep_scale = mc__dropout_scale(dropout_p);
    mc__keep_cache kc;
    int t, t2, d;
    mc__keep_cache_init(&kc, seed);
    for (t = 0; t < S; t++) {
        const float *q = qkv + ((size_t)t * B + b) * C3 + (size_t)h * 3 * HD;
        const size_t row_index = (((size_t)b * NH + h) * S + t) * S;
        float *row = probs + row_index;
        float *o = out + ((size_t)t * B + b) * C + (size_t)h * HD;
        float max = -INFINITY, sum = 0.0f, inv;
        for (t2 = 0; t2 <= t; t2++) {
            const float *k = qkv + ((size_t)t2 * B + b) * C3 + (size_t)h * 3 * HD + HD;
            row[t2] = mc__dot(q, k, HD) * scale;
            if (row[t2] > max) max = row[t2];
        }
        for (t2 = 0; t2 <= t; t2++) {
            row[t2] = expf(row[t2] - max);
            sum += row[t2];
        }
        inv = 1.0f / sum;
        for (t2 = 0; t2 <= t; t2++) row[t2] *= inv;
        for (t2 = t + 1; t2 < S; t2++) row[t2] = 0.0f;   /* masked (future) keys */
        for (d = 0; d < HD; d++) o[d] = 0.0f;
        for (t2 = 0; t2 <= t; t2++) {
            const float *v = qkv + ((size_t)t2 * B + b) * C3 + (size_t)h * 3 * HD + 2 * HD;
            const float w = mc__attn_weight(&kc, row[t2], offset + row_index + t2, dropout_p,
                                            keep_scale);
            for (d = 0; d < HD; d++) o[d] += w * v[d];
        }
    }
}

/* out[S,B,NH*HD] (=), probs[B,NH,S,S] (=) <- qkv[S,B,NH*3*HD] */
static void mc__cpu_attention_forward_f32(float *out, float *probs, const float *qkv, int S,
                                          int B, int NH, int HD, float dropout_p, uint64_t seed,
                                          uint64_t offset) {
    int b, h;
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++)
            mc__cpu_attention_forward_bh(out, probs, qkv, S, B, NH, HD, dropout_p, seed, offset,
                                         b, h);
}

static int mc__cpu_attention_forward(const mc_ops *o, void *out, float *stats, const void *qkv,
                                     int S, int B, int NH, int HD, float dropout_p,
                                     uint64_t seed, uint64_t offset, mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK;
    size_t n = (size_t)S * B;
    float *y = mc__f32_add(&s, &rc, out, n * NH * HD, dt, MC__OUT, "attention_forward");
    const float *x = mc__f32_add(&s, &rc, qkv, n * NH * 3 * HD, dt, MC__IN, "attention_forward");
    (void)o;
    if (rc == MC_OK && !stats)
        rc = MC__FAIL(MC_ERR_INVALID_ARG, "cpu attention_forward: stats (the probabilities "
                      "[B, NH, S, S]) is NULL");
    if (rc == MC_OK)
        mc__cpu_attention_forward_f32(y, stats, x, S, B, NH, HD, dropout_p, seed, offset);
    return mc__f32_done(&s, rc);
}

/* dqkv[S,B,NH*3*HD] (+=) of one (sequence b, head h) <- dout[S,B,NH*HD], qkv,
   probs[B,NH,S,S]. Per row t:
     dv_t2 += D[t2] dout_t,  dP[t2] = (dout_t . v_t2) * mask / (1 - p),
     dscore[t2] = P[t2] (dP[t2] - sum_u P[u] dP[u]),
     dq_t += dscore[t2] k_t2 / sqrt(HD),  dk_t2 += dscore[t2] q_t / sqrt(HD).
   dP is computed twice (once for the sum, once for dscore) instead of being stored. Different
   (b, h) touch disjoint columns of dqkv, so they may run in any order or at once. */
static void mc__cpu_attention_backward_bh(float *dqkv, const float *dout, const float *qkv,
                                          const float *probs, int S, int B, int NH, int HD,
                                          float dropout_p, uint64_t seed, uint64_t offset, int b,
                                          int h) {
    const size_t C3 = (size_t)NH * 3 * HD, C = (size_t)NH * HD;
    const float scale = 1.0f / sqrtf((float)HD), keep_scale = mc__dropout_scale(dropout_p);
    mc__keep_cache kc;
    int t, t2, d;
    mc__keep_cache_init(&kc, seed);
    for (t = 0; t < S; t++) {
        const size_t head = (size_t)h * 3 * HD;
        const float *q = qkv + ((size_t)t * B + b) * C3 + head;
        float *dq = dqkv + ((size_t)t * B + b) * C3 + head;
        const float *dy = dout + ((size_t)t * B + b) * C + (size_t)h * HD;
        const size_t row_index = (((size_t)b * NH + h) * S + t) * S;
        const float *P = probs + row_index;
        float p_dp = 0.0f;
        for (t2 = 0; t2 <= t; t2++) {
            const size_t tok = ((size_t)t2 * B + b) * C3 + head;
            const float *v = qkv + tok + 2 * HD;
            float *dv = dqkv + tok + 2 * HD;
            const float w = mc__attn_weight(&kc, P[t2], offset + row_index + t2, dropout_p,
                                            keep_scale);
            const float dP = mc__attn_weight(&kc, mc__dot(dy, v, HD), offset + row_index + t2,
                                             dropout_p, keep_scale);
            for (d = 0; d < HD; d++) dv[d] += w * dy[d];
            p_dp += P[t2] * dP;
        }
        for (t2 = 0; t2 <= t; t2++) {
            const size_t tok = ((size_t)t2 * B + b) * C3 + head;
            const float *k = qkv + tok + HD;
            float *dk = dqkv + tok + HD;
            const float dP = mc__attn_weight(&kc, mc__dot(dy, qkv + tok + 2 * HD, HD),
                                             offset + row_index + t2, dropout_p, keep_scale);
            const float ds = P[t2] * (dP - p_dp) * scale;
            for (d = 0; d < HD; d++) {
                dq[d] += ds * k[d];
                dk[d] += ds * q[d];
            }
        }
    }
}

/* dqkv[S,B,NH*3*HD] (=) <- dout[S,B,NH*HD], qkv, probs[B,NH,S,S] */
static void mc__cpu_attention_backward_f32(float *dqkv, const float *dout, const float *qkv,
                                           const float *probs, int S, int B, int NH, int HD,
                                           float dropout_p, uint64_t seed, uint64_t offset) {
    int b, h;
    mc__cpu_fill_f32(dqkv, 0.0f, (size_t)S * B * NH * 3 * HD);
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++)
            mc__cpu_attention_backward_bh(dqkv, dout, qkv, probs, S, B, NH, HD, dropout_p, seed,
                                          offset, b, h);
}

static int mc__cpu_attention_backward(const mc_ops *o, void *dqkv, const void *dout,
                                      const void *qkv, const void *out, const float *stats, int S,
                                      int B, int NH, int HD, float dropout_p, uint64_t seed,
                                      uint64_t offset, mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK;
    size_t n = (size_t)S * B;
    float *dx = mc__f32_add(&s, &rc, dqkv, n * NH * 3 * HD, dt, MC__OUT, "attention_backward");
    const float *dy = mc__f32_add(&s, &rc, dout, n * NH * HD, dt, MC__IN, "attention_backward");
    const float *x = mc__f32_add(&s, &rc, qkv, n * NH * 3 * HD, dt, MC__IN, "attention_backward");
    (void)o;
    (void)out;   /* the probabilities hold everything the CPU backward needs */
    if (rc == MC_OK && !stats)
        rc = MC__FAIL(MC_ERR_INVALID_ARG, "cpu attention_backward: stats (the probabilities) is "
                      "NULL");
    if (rc == MC_OK)
        mc__cpu_attention_backward_f32(dx, dy, x, stats, S, B, NH, HD, dropout_p, seed, offset);
    return mc__f32_done(&s, rc);
}

// ---------------------------------------------------------------------------------------------
// >>core.ops cpu embedding, cross-entropy pieces, adamw

static int mc__cpu_check_ids(const mc_ops *o, const int *ids, int N, int V, const char *fn,
                             const char *what) {
    int i;
    (void)o;
    for (i = 0; i < N; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "%s: %s[%d] = %d is outside the vocabulary [0, %d)", fn, what, i,
                            ids[i], V);
    return MC_OK;
}

/* out[N,C] = table[ids[n] - vocab_start] for ids in [vocab_start, vocab_end), else 0 */
static int mc__cpu_embedding_forward(const mc_ops *o, void *out, const int *ids,
                                     const void *table, int N, int C, int vocab_start,
                                     int vocab_end, mc_dtype dt) {
    size_t row = mc_dtype_bytes(dt, (size_t)C);
    int n, rc;
    (void)o;
    if ((rc = mc__cpu_check_dt("embedding_forward", dt)) != MC_OK) return rc;
    for (n = 0; n < N; n++) {
        const int id = ids[n];
        char *dst = (char *)out + (size_t)n * row;
        if (id >= vocab_start && id < vocab_end)
            memcpy(dst, (const char *)table + (size_t)(id - vocab_start) * row, row);
        else
            memset(dst, 0, row);   /* +0.0 in fp32 and bf16 */
    }
    return MC_OK;
}

/* dtable[V_local, C] += dout[N,C] rows of the local ids (tokens in order) */
static int mc__cpu_embedding_backward(const mc_ops *o, float *dtable, const void *dout,
                                      const int *ids, int N, int C, int vocab_start,
                                      int vocab_end, mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK, n;
    const float *dy = mc__f32_add(&s, &rc, dout, (size_t)N * C, dt, MC__IN, "embedding_backward");
    (void)o;
    if (rc == MC_OK)
        for (n = 0; n < N; n++) {
            const int id = ids[n];
            if (id >= vocab_start && id < vocab_end)
                mc__cpu_axpy_f32(dtable + (size_t)(id - vocab_start) * C, 1.0f,
                                 dy + (size_t)n * C, (size_t)C);
        }
    return mc__f32_done(&s, rc);
}

/* max[N] = max over the row of logits[N,V] (-inf for V = 0) */
static int mc__cpu_row_max(const mc_ops *o, float *max, const void *logits, int N, int V,
                           mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK, n, j;
    const float *x = mc__f32_add(&s, &rc, logits, (size_t)N * V, dt, MC__IN, "row_max");
    (void)o;
    if (rc == MC_OK)
        for (n = 0; n < N; n++) {
            const float *l = x + (size_t)n * V;
            float m = -INFINITY;
            for (j = 0; j < V; j++)
                if (l[j] > m) m = l[j];
            max[n] = m;
        }
    return mc__f32_done(&s, rc);
}

/* out[N] = logits[n, targets[n] - vocab_start] when the target is in this shard, else 0 */
static int mc__cpu_target_logit(const mc_ops *o, float *out, const void *logits,
                                const int *targets, int N, int V, int vocab_start, mc_dtype dt) {
    int n, rc;
    (void)o;
    if ((rc = mc__cpu_check_dt("target_logit", dt)) != MC_OK) return rc;
    for (n = 0; n < N; n++) {
        const int local = targets[n] - vocab_start;
        size_t at = (size_t)n * V + (size_t)local;
        if (!(targets[n] >= vocab_start && local < V))
            out[n] = 0.0f;
        else
            out[n] = dt == MC_F32 ? ((const float *)logits)[at]
                                  : mc_bf16_to_float(((const mc_bf16 *)logits)[at]);
    }
    return MC_OK;
}

/* sum[N] = sum_j exp(logits[n,j] - max[n]) */
static int mc__cpu_sum_exp(const mc_ops *o, float *sum, const void *logits, const float *max,
                           int N, int V, mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK, n, j;
    const float *x = mc__f32_add(&s, &rc, logits, (size_t)N * V, dt, MC__IN, "sum_exp");
    (void)o;
    if (rc == MC_OK)
        for (n = 0; n < N; n++) {
            const float *l = x + (size_t)n * V;
            double acc = 0.0;
            for (j = 0; j < V; j++) acc += (double)expf(l[j] - max[n]);
            sum[n] = (float)acc;
        }
    return mc__f32_done(&s, rc);
}

/* sum[N] = sum_j logits[n,j] */
static int mc__cpu_row_sum(const mc_ops *o, float *sum, const void *logits, int N, int V,
                           mc_dtype dt) {
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK, n, j;
    const float *x = mc__f32_add(&s, &rc, logits, (size_t)N * V, dt, MC__IN, "row_sum");
    (void)o;
    if (rc == MC_OK)
        for (n = 0; n < N; n++) {
            const float *l = x + (size_t)n * V;
            double acc = 0.0;
            for (j = 0; j < V; j++) acc += (double)l[j];
            sum[n] = (float)acc;
        }
    return mc__f32_done(&s, rc);
}

/* The per-token loss from the reduced pieces, in double:
     nll  = log(sum_exp) + max - target_logit
     loss = (1 - s) nll - s (logit_sum / K - max - log(sum_exp))
   logit_sum is NULL without smoothing. */
static int mc__cpu_cross_entropy_loss(const mc_ops *o, float *losses, double *loss_sum,
                                      const float *max, const float *sum_exp,
                                      const float *target_logit, const float *logit_sum, int N,
                                      int K, float smoothing) {
    double s = smoothing, total = 0.0;
    int i;
    (void)o;
    for (i = 0; i < N; i++) {
        double log_z = log((double)sum_exp[i]) + (double)max[i];   /* log sum_j exp(logit_j) */
        double nll = log_z - (double)target_logit[i];
        double loss = nll;
        if (logit_sum) loss = (1.0 - s) * nll - s * ((double)logit_sum[i] / K - log_z);
        losses[i] = (float)loss;
    }
    if (loss_sum) {
        for (i = 0; i < N; i++) total += (double)losses[i];
        *loss_sum = total;
    }
    return MC_OK;
}

/* dlogits[N,V] (=) <- logits[N,V], max[N], sum[N] (global), targets[N], dloss[N] */
static int mc__cpu_cross_entropy_backward(const mc_ops *o, void *dlogits, const void *logits,
                                          const float *max, const float *sum, const int *targets,
                                          const float *dloss, int N, int V, int vocab_start,
                                          float smoothing, int vocab_global, mc_dtype dt) {
    const float uniform = vocab_global > 0 ? smoothing / (float)vocab_global : 0.0f;
    mc__f32_set s = MC__F32_SET_EMPTY;
    int rc = MC_OK, n, j;
    size_t nv = (size_t)N * V;
    const float *x = mc__f32_add(&s, &rc, logits, nv, dt, MC__IN, "cross_entropy_backward");
    float *dx = dlogits == logits && dt == MC_F32
                    ? (float *)dlogits
                    : mc__f32_add(&s, &rc, dlogits, nv, dt, MC__OUT, "cross_entropy_backward");
    (void)o;
    if (rc == MC_OK)
        for (n = 0; n < N; n++) {
            const float *l = x + (size_t)n * V;
            float *dl = dx + (size_t)n * V;
            const float inv = 1.0f / sum[n], g = dloss[n];
            const int local = targets[n] - vocab_start;
            const int owned = targets[n] >= vocab_start && local < V;
            for (j = 0; j < V; j++) {
                float d = expf(l[j] - max[n]) * inv - uniform;
                if (owned && j == local) d -= 1.0f - smoothing;
                dl[j] = d * g;
            }
        }
    return mc__f32_done(&s, rc);
}

/* main, m, v (fp32 state) updated in place from grad, span by span; bias corrections in
   double */
static int mc__cpu_adamw(const mc_ops *o, float *main, const float *grad, float *m, float *v,
                         void *model_param, const mc_adamw_span *spans, int n_spans,
                         const mc_adamw_step *h, mc_dtype model_dt) {
    const float beta1 = h->beta1, beta2 = h->beta2, lr = h->lr, eps = h->eps;
    const float bc1 = (float)(1.0 - pow((double)beta1, (double)h->step));
    const float bc2 = (float)(1.0 - pow((double)beta2, (double)h->step));
    size_t i;
    int k, rc;
    (void)o;
    if (model_param && (rc = mc__cpu_check_dt("adamw", model_dt)) != MC_OK) return rc;
    for (k = 0; k < n_spans; k++) {
        const mc_adamw_span *sp = &spans[k];
        const float weight_decay = sp->weight_decay;
        const float *gr = grad + sp->grad_at;
        float *p = main + sp->main_at, *mk = m + sp->state_at, *vk = v + sp->state_at;
        for (i = 0; i < sp->n; i++) {
            const float g = gr[i];
            const float mi = beta1 * mk[i] + (1.0f - beta1) * g;
            const float vi = beta2 * vk[i] + (1.0f - beta2) * g * g;
            const float m_hat = mi / bc1, v_hat = vi / bc2;
            mk[i] = mi;
            vk[i] = vi;
            p[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * p[i]);
        }
        if (model_param) {
            void *dst = (char *)model_param + mc_dtype_bytes(model_dt, sp->grad_at);
            if (dst != (void *)p && (rc = mc__cpu_copy(o, dst, p, sp->n, model_dt,
                                                       MC_F32)) != MC_OK)
                return rc;
        }
    }
    return MC_OK;
}

/* In mc_ops field order (positional: C++17 has no designated initializers). The tables
   differ in their name and their gemm only. */
#define MC__CPU_OPS_TABLE(name, gemm) {                                                     \
    name, MC_DEVICE_CPU, NULL, mc__cpu_alloc, mc__cpu_free, mc__cpu_copy_bytes,                 \
    mc__cpu_copy_bytes, mc__cpu_copy_2d, mc__cpu_synchronize, mc__cpu_fill, mc__cpu_copy,       \
    mc__cpu_axpy, mc__cpu_scale, mc__cpu_sum_squares, gemm, mc__cpu_bias_backward,              \
    mc__cpu_layernorm_forward, mc__cpu_layernorm_backward, mc__cpu_gelu_forward,                \
    mc__cpu_gelu_backward, mc__cpu_gemm_gelu_forward, mc__cpu_gemm_gelu_backward,               \
    mc__cpu_attention_stats, mc__cpu_attention_forward,                                         \
    mc__cpu_attention_backward, mc__cpu_dropout_forward, mc__cpu_dropout_backward,              \
    mc__cpu_check_ids, mc__cpu_embedding_forward, mc__cpu_embedding_backward,                   \
    mc__cpu_row_max, mc__cpu_target_logit, mc__cpu_sum_exp, mc__cpu_row_sum,                    \
    mc__cpu_cross_entropy_loss, mc__cpu_cross_entropy_backward, mc__cpu_adamw,                  \
    NULL, /* no account: give a copy of the table one */                                        \
    NULL, /* no completion markers: a CPU op has finished when it returns */                    \
    NULL, NULL                                                                                  \
}

static const mc_ops mc__cpu_ops = MC__CPU_OPS_TABLE("cpu", mc__cpu_gemm);
#if defined(MC_WITH_CBLAS)
static const mc_ops mc__cpu_cblas_ops = MC__CPU_OPS_TABLE("cpu-cblas", mc__cpu_gemm_cblas_op);
#endif

// ---------------------------------------------------------------------------------------------
// >>core.ops cpu fast  The default CPU table: the reference's formulas, run by the threads of
// this process (OpenMP, when the library is compiled with -fopenmp) and with the GEMM through
// a BLAS (MC_USE_CBLAS) or the blocked kernel above, split across the threads.
//
// Results do not depend on the number of threads: every op splits its work into pieces fixed
// by the shapes alone (rows, (sequence, head) pairs, column slices, fixed-size chunks), each
// piece is computed as the reference computes it, and partial sums are added in piece order.
// So the element-wise ops, layernorm, attention, dropout, embedding, cross entropy and AdamW
// give the reference's bits; sum_squares adds fp64 partials of 32768-element chunks (not one
// running sum: ~1e-16 relative). The GEMM splits C into one block of rows (or columns) per
// thread: the blocked kernel gives the reference's bits whatever the split; a BLAS sums in its
// own order and may choose another kernel for a narrower block, so its results are within
// 1e-5 * sum_k |a_ik b_kj| of the reference at any thread count (tests/test_ops.c checks
// both), not bit-identical across thread counts.
// bf16 tensors take the reference ops (the bf16 CPU path is an emulation for checking).
//
// Threads (mc_cpu_threads): MC_CPU_THREADS in the environment, else OMP_NUM_THREADS, else the
// cores this process may run on, shared with the other ranks of the host: a rank that the
// launcher bound to some cores uses those; an unbound one uses online cores / local ranks
// (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, at least 1 thread), so `mpirun -np 8` on 2
// cores runs 1 thread per rank. A multi-threaded BLAS is set to 1 thread (OpenBLAS): the
// threads of the table are the only ones.

#if defined(_OPENMP)
#include <omp.h>
#define MC__PRAGMA(x) _Pragma(#x)
#define MC__OMP(x) MC__PRAGMA(omp x)
#else
#define MC__OMP(x)
#endif
#include <unistd.h>   /* defines: sysconf (online cores) */

#define MC__PAR_MIN 32768       /* elements below which a loop stays on one thread */
#define MC__SUMSQ_CHUNK 32768   /* sum_squares: elements per fp64 partial */
#define MC__COL_SLICE 64        /* column-sliced reductions: columns per piece */

static int mc__cpu_threads_set = 0;   /* 0: the default (mc_cpu_set_threads) */

#if defined(_OPENMP)
static int mc__env_int(const char *name) {
    const char *v = getenv(name);
    long n;
    char *end;
    if (!v || !*v) return 0;
    n = strtol(v, &end, 10);
    return *end == '\0' && n > 0 && n < 4096 ? (int)n : 0;
}

static int mc__cpu_default_threads(void) {
    static int cached = 0;
    int n, avail, online, local;
    if (cached > 0) return cached;
    if ((n = mc__env_int("MC_CPU_THREADS")) > 0) return cached = n;
    if (mc__env_int("OMP_NUM_THREADS") > 0) return cached = omp_get_max_threads();
    avail = omp_get_num_procs();   /* the cores of this process's affinity mask */
    online = (int)sysconf(_SC_NPROCESSORS_ONLN);
    local = mc__env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (local <= 0) local = mc__env_int("MPI_LOCALNRANKS");
    if (local <= 0) local = 1;
    n = avail < online ? avail : (online > 0 ? online : avail) / local;   /* bound: its cores */
    return cached = n > 0 ? n : 1;
}
#endif

MC_API int mc_cpu_threads(void) {
#if defined(_OPENMP)
    return mc__cpu_threads_set > 0 ? mc__cpu_threads_set : mc__cpu_default_threads();
#else
    return 1;
#endif
}

MC_API void mc_cpu_set_threads(int n) { mc__cpu_threads_set = n > 0 ? n : 0; }

MC_API const char *mc_cpu_blas(void) {
#if defined(MC_USE_CBLAS) && defined(OPENBLAS_VERSION)
    static char name[64];   /* OPENBLAS_VERSION is " OpenBLAS 0.3.21 " */
    if (!name[0]) {
        const char *v = OPENBLAS_VERSION;
        size_t n;
        while (*v == ' ') v++;
        n = strlen(v) < sizeof name - 1 ? strlen(v) : sizeof name - 1;
        while (n > 0 && v[n - 1] == ' ') n--;
        memcpy(name, v, n);
        name[n] = '\0';
    }
    return name;
#elif defined(MC_USE_CBLAS)
    return "CBLAS";
#else
    return NULL;
#endif
}

/* Threads for a loop over n units of `grain` elements each: 1 below MC__PAR_MIN elements. */
static int mc__par_threads(size_t n, size_t grain) {
    int nt = mc_cpu_threads();
    if (nt <= 1 || n * grain < MC__PAR_MIN) return 1;
    return (size_t)nt < n ? nt : (int)(n > 0 ? n : 1);
}

/* The BLAS runs single-threaded inside the table's own threads. */
static void mc__blas_single_thread(void) {
#if defined(MC_USE_CBLAS) && defined(OPENBLAS_VERSION)
    static int done = 0;
    if (!done) {
        openblas_set_num_threads(1);
        done = 1;
    }
#endif
}

// fast element-wise

static int mc__fast_fill(const mc_ops *o, void *x, float value, size_t n, mc_dtype dt) {
    const int nt = mc__par_threads(n, 1);
    ptrdiff_t i;
    if (dt != MC_F32 || nt == 1) return mc__cpu_fill(o, x, value, n, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) ((float *)x)[i] = value;
    return MC_OK;
}

static int mc__fast_copy(const mc_ops *o, void *dst, const void *src, size_t n, mc_dtype dst_dt,
                         mc_dtype src_dt) {
    const int nt = mc__par_threads(n, 1);
    ptrdiff_t i;
    if (dst_dt != MC_F32 || src_dt != MC_F32 || nt == 1 || dst == src ||
        ((uintptr_t)dst < (uintptr_t)src + n * sizeof(float) &&
         (uintptr_t)src < (uintptr_t)dst + n * sizeof(float)))
        return mc__cpu_copy(o, dst, src, n, dst_dt, src_dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) ((float *)dst)[i] = ((const float *)src)[i];
    return MC_OK;
}

static int mc__fast_axpy(const mc_ops *o, void *y, float a, const void *x, size_t n, mc_dtype dt) {
    const int nt = mc__par_threads(n, 1);
    float *fy = (float *)y;
    const float *fx = (const float *)x;
    ptrdiff_t i;
    if (dt != MC_F32 || nt == 1) return mc__cpu_axpy(o, y, a, x, n, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) fy[i] += a * fx[i];
    return MC_OK;
}

static int mc__fast_scale(const mc_ops *o, void *x, float a, size_t n, mc_dtype dt) {
    const int nt = mc__par_threads(n, 1);
    float *fx = (float *)x;
    ptrdiff_t i;
    if (dt != MC_F32 || nt == 1) return mc__cpu_scale(o, x, a, n, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) fx[i] *= a;
    return MC_OK;
}

/* The fp64 sum of squares in chunks of MC__SUMSQ_CHUNK elements per span, partials added in
   order: the same value with any number of threads. */
static int mc__fast_sum_squares(const mc_ops *o, double *out, const float *x, const size_t *spans,
                                int n_spans) {
    double total = 0.0, part[64];
    int k;
    if (!out) return MC__FAIL(MC_ERR_INVALID_ARG, "cpu sum_squares: out is NULL");
    for (k = 0; k < n_spans; k++) {
        size_t lo = spans[2 * k], hi = spans[2 * k + 1], at;
        for (at = lo; at < hi; at += (size_t)64 * MC__SUMSQ_CHUNK) {   /* 64 chunks at a time */
            size_t end = hi - at < (size_t)64 * MC__SUMSQ_CHUNK ? hi : at + (size_t)64 * MC__SUMSQ_CHUNK;
            ptrdiff_t nc = (ptrdiff_t)((end - at + MC__SUMSQ_CHUNK - 1) / MC__SUMSQ_CHUNK), c;
            const int nt = mc__par_threads((size_t)nc, MC__SUMSQ_CHUNK);
            (void)nt;
            MC__OMP(parallel for num_threads(nt) schedule(static))
            for (c = 0; c < nc; c++) {
                size_t i = at + (size_t)c * MC__SUMSQ_CHUNK, e = i + MC__SUMSQ_CHUNK;
                double s = 0.0;
                if (e > end) e = end;
                for (; i < e; i++) s += (double)x[i] * (double)x[i];
                part[c] = s;
            }
            for (c = 0; c < nc; c++) total += part[c];
        }
    }
    (void)o;
    *out = total;
    return MC_OK;
}

// fast gemm: C split into row (or column) blocks, one per thread; each block is one call of
// the BLAS (or of the blocked kernel) on its piece of op(A) (or op(B)).

static void mc__fast_gemm_piece(float *C, const float *A, const float *B, int M, int N, int K,
                                int trans_a, int trans_b, float alpha, float beta, int i0, int mi,
                                int j0, int nj) {
#if defined(MC_USE_CBLAS)
    if (K > 0) {
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, mi, nj, K, alpha,
                    trans_a ? A + i0 : A + (size_t)i0 * K, trans_a ? M : K,
                    trans_b ? B + (size_t)j0 * K : B + j0, trans_b ? K : N, beta,
                    C + (size_t)i0 * N + j0, N);
        return;
    }
#endif
    mc__gemm_blocked_range(C, A, B, M, N, K, trans_a, trans_b, alpha, beta, i0, i0 + mi, j0,
                           j0 + nj);
}

static void mc__fast_gemm_f32(float *C, const float *A, const float *B, int M, int N, int K,
                              int trans_a, int trans_b, float alpha, float beta) {
    const int by_rows = M >= N;
    const int len = by_rows ? M : N;
    /* pieces are whole multiples of 16 rows / columns, at most one per thread */
    const size_t work = (size_t)M * (size_t)N * (size_t)(K > 0 ? K : 1);
    int nt = mc_cpu_threads(), pieces, step;
    ptrdiff_t p;
    if (work < (size_t)MC__PAR_MIN * 8) nt = 1;
    pieces = nt < (len + 15) / 16 ? nt : (len + 15) / 16;
    if (pieces < 1) pieces = 1;
    step = ((len + pieces - 1) / pieces + 15) / 16 * 16;
    mc__blas_single_thread();
    MC__OMP(parallel for num_threads(pieces) schedule(static) if(pieces > 1))
    for (p = 0; p < pieces; p++) {
        int lo = (int)p * step, n = len - lo < step ? len - lo : step;
        if (n <= 0) continue;
        if (by_rows)
            mc__fast_gemm_piece(C, A, B, M, N, K, trans_a, trans_b, alpha, beta, lo, n, 0, N);
        else
            mc__fast_gemm_piece(C, A, B, M, N, K, trans_a, trans_b, alpha, beta, 0, M, lo, n);
    }
}

/* out[N,C] += bias[C], rows split across the threads */
static void mc__fast_add_bias(float *out, const float *bias, int N, int C) {
    const int nt = mc__par_threads((size_t)N, (size_t)C);
    ptrdiff_t n;
    int c;
    (void)nt;
    if (!bias) return;
    MC__OMP(parallel for num_threads(nt) schedule(static) private(c))
    for (n = 0; n < N; n++)
        for (c = 0; c < C; c++) out[(size_t)n * C + c] += bias[c];
}

static int mc__fast_gemm(const mc_ops *o, void *C, const void *A, const void *B, const void *bias,
                         int M, int N, int K, int trans_a, int trans_b, float alpha, float beta,
                         mc_dtype c_dt, mc_dtype ab_dt) {
    (void)o;
    return mc__cpu_gemm_with(mc__fast_gemm_f32, mc__fast_add_bias, C, A, B, bias, M, N, K,
                             trans_a, trans_b, alpha, beta, c_dt, ab_dt);
}

// fast column-sliced reductions (the rows of a column added in order, as the reference does)

static int mc__fast_bias_backward(const mc_ops *o, float *dbias, const void *dout, int N, int C,
                                  mc_dtype dt) {
    const ptrdiff_t slices = (C + MC__COL_SLICE - 1) / MC__COL_SLICE;
    const int nt = mc__par_threads((size_t)slices, (size_t)N * MC__COL_SLICE);
    const float *dy = (const float *)dout;
    ptrdiff_t sl;
    if (dt != MC_F32 || nt == 1) return mc__cpu_bias_backward(o, dbias, dout, N, C, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (sl = 0; sl < slices; sl++) {
        const int c0 = (int)sl * MC__COL_SLICE;
        const int c1 = c0 + MC__COL_SLICE < C ? c0 + MC__COL_SLICE : C;
        int n, c;
        for (n = 0; n < N; n++)
            for (c = c0; c < c1; c++) dbias[c] += dy[(size_t)n * C + c];
    }
    return MC_OK;
}

static int mc__fast_layernorm_forward(const mc_ops *o, void *out, float *mean, float *rstd,
                                      const void *inp, const void *weight, const void *bias,
                                      int N, int C, float eps, mc_dtype dt) {
    const int nt = mc__par_threads((size_t)N, (size_t)C);
    ptrdiff_t n;
    if (dt != MC_F32 || nt == 1)
        return mc__cpu_layernorm_forward(o, out, mean, rstd, inp, weight, bias, N, C, eps, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (n = 0; n < N; n++)
        mc__cpu_layernorm_forward_f32((float *)out + (size_t)n * C, mean ? mean + n : NULL,
                                      rstd ? rstd + n : NULL, (const float *)inp + (size_t)n * C,
                                      (const float *)weight, (const float *)bias, 1, C, eps);
    return MC_OK;
}

/* dinp row by row (rows split across the threads), then dweight and dbias column slice by
   column slice, rows in order: the reference's sums. */
static int mc__fast_layernorm_backward(const mc_ops *o, void *dinp, float *dweight, float *dbias,
                                       const void *dout, const void *inp, const void *weight,
                                       const float *mean, const float *rstd, int N, int C,
                                       mc_dtype dt) {
    const int nt = mc__par_threads((size_t)N, (size_t)C);
    const ptrdiff_t slices = (C + MC__COL_SLICE - 1) / MC__COL_SLICE;
    const float *dy = (const float *)dout, *x = (const float *)inp;
    ptrdiff_t n, sl;
    if (dt != MC_F32 || nt == 1)
        return mc__cpu_layernorm_backward(o, dinp, dweight, dbias, dout, inp, weight, mean, rstd,
                                          N, C, dt);
    if (dinp) {
        MC__OMP(parallel for num_threads(nt) schedule(static))
        for (n = 0; n < N; n++)
            mc__cpu_layernorm_backward_f32((float *)dinp + (size_t)n * C, NULL, NULL,
                                           dy + (size_t)n * C, x + (size_t)n * C,
                                           (const float *)weight, mean + n, rstd + n, 1, C);
    }
    if (!dweight && !dbias) return MC_OK;
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (sl = 0; sl < slices; sl++) {
        const int c0 = (int)sl * MC__COL_SLICE;
        const int c1 = c0 + MC__COL_SLICE < C ? c0 + MC__COL_SLICE : C;
        int r, c;
        for (r = 0; r < N; r++) {
            const float *dyr = dy + (size_t)r * C, *xr = x + (size_t)r * C;
            const float m = mean[r], s = rstd[r];
            for (c = c0; c < c1; c++) {
                const float xhat = (xr[c] - m) * s;
                if (dbias) dbias[c] += dyr[c];
                if (dweight) dweight[c] += xhat * dyr[c];
            }
        }
    }
    return MC_OK;
}

static int mc__fast_gelu_forward(const mc_ops *o, void *out, const void *inp, size_t n,
                                 mc_dtype dt) {
    const int nt = mc__par_threads(n, 8);   /* tanhf: a few elements are worth a thread */
    float *y = (float *)out;
    const float *x = (const float *)inp;
    ptrdiff_t i;
    if (dt != MC_F32 || nt == 1) return mc__cpu_gelu_forward(o, out, inp, n, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(MC__GELU_SCALE * (v + MC__GELU_CUBIC * v * v * v)));
    }
    return MC_OK;
}

static int mc__fast_gelu_backward(const mc_ops *o, void *dinp, const void *inp, const void *dout,
                                  size_t n, mc_dtype dt) {
    const int nt = mc__par_threads(n, 8);
    const float *x = (const float *)inp, *dy = (const float *)dout;
    float *dx = (float *)dinp;
    ptrdiff_t i;
    if (dt != MC_F32 || nt == 1) return mc__cpu_gelu_backward(o, dinp, inp, dout, n, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) {
        const float v = x[i];
        const float t = tanhf(MC__GELU_SCALE * (v + MC__GELU_CUBIC * v * v * v));
        const float dtanh = (1.0f - t * t) * MC__GELU_SCALE * (1.0f + 3.0f * MC__GELU_CUBIC * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dtanh);
    }
    return MC_OK;
}

/* dropout in chunks of MC__SUMSQ_CHUNK elements, each with its own Philox cache */
static int mc__fast_dropout_apply(void *out, const void *inp, size_t n, float p, uint64_t seed,
                                  uint64_t offset, mc_dtype dt) {
    const ptrdiff_t chunks = (ptrdiff_t)((n + MC__SUMSQ_CHUNK - 1) / MC__SUMSQ_CHUNK);
    const int nt = mc__par_threads((size_t)chunks, MC__SUMSQ_CHUNK);
    const float scale = mc__dropout_scale(p);
    ptrdiff_t c;
    if (dt != MC_F32 || p <= 0.0f || nt == 1)
        return mc__cpu_dropout_apply(out, inp, n, p, seed, offset, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (c = 0; c < chunks; c++) {
        const float *x = (const float *)inp;
        float *y = (float *)out;
        size_t i = (size_t)c * MC__SUMSQ_CHUNK, e = i + MC__SUMSQ_CHUNK;
        mc__keep_cache kc;
        mc__keep_cache_init(&kc, seed);
        if (e > n) e = n;
        for (; i < e; i++) y[i] = mc__keep(&kc, offset + i, p) ? x[i] * scale : 0.0f;
    }
    return MC_OK;
}

static int mc__fast_dropout_forward(const mc_ops *o, void *out, const void *inp, size_t n, float p,
                                    uint64_t seed, uint64_t offset, mc_dtype dt) {
    (void)o;
    return mc__fast_dropout_apply(out, inp, n, p, seed, offset, dt);
}

static int mc__fast_dropout_backward(const mc_ops *o, void *dinp, const void *dout, size_t n,
                                     float p, uint64_t seed, uint64_t offset, mc_dtype dt) {
    (void)o;
    return mc__fast_dropout_apply(dinp, dout, n, p, seed, offset, dt);
}

// fast attention: one (sequence, head) pair per piece

static int mc__fast_attention_forward(const mc_ops *o, void *out, float *stats, const void *qkv,
                                      int S, int B, int NH, int HD, float dropout_p,
                                      uint64_t seed, uint64_t offset, mc_dtype dt) {
    const ptrdiff_t pairs = (ptrdiff_t)B * NH;
    const int nt = mc__par_threads((size_t)pairs, (size_t)S * S * HD / 2);
    ptrdiff_t bh;
    if (dt != MC_F32 || nt == 1 || !stats)
        return mc__cpu_attention_forward(o, out, stats, qkv, S, B, NH, HD, dropout_p, seed,
                                         offset, dt);
    MC__OMP(parallel for num_threads(nt) schedule(dynamic, 1))
    for (bh = 0; bh < pairs; bh++)
        mc__cpu_attention_forward_bh((float *)out, stats, (const float *)qkv, S, B, NH, HD,
                                     dropout_p, seed, offset, (int)(bh / NH), (int)(bh % NH));
    return MC_OK;
}

static int mc__fast_attention_backward(const mc_ops *o, void *dqkv, const void *dout,
                                       const void *qkv, const void *out, const float *stats,
                                       int S, int B, int NH, int HD, float dropout_p,
                                       uint64_t seed, uint64_t offset, mc_dtype dt) {
    const ptrdiff_t pairs = (ptrdiff_t)B * NH;
    const int nt = mc__par_threads((size_t)pairs, (size_t)S * S * HD);
    ptrdiff_t bh;
    if (dt != MC_F32 || nt == 1 || !stats)
        return mc__cpu_attention_backward(o, dqkv, dout, qkv, out, stats, S, B, NH, HD,
                                          dropout_p, seed, offset, dt);
    mc__fast_fill(o, dqkv, 0.0f, (size_t)S * B * NH * 3 * HD, MC_F32);
    MC__OMP(parallel for num_threads(nt) schedule(dynamic, 1))
    for (bh = 0; bh < pairs; bh++)
        mc__cpu_attention_backward_bh((float *)dqkv, (const float *)dout, (const float *)qkv,
                                      stats, S, B, NH, HD, dropout_p, seed, offset,
                                      (int)(bh / NH), (int)(bh % NH));
    return MC_OK;
}

// fast embedding backward (column slices, tokens in order) and cross-entropy rows

static int mc__fast_embedding_backward(const mc_ops *o, float *dtable, const void *dout,
                                       const int *ids, int N, int C, int vocab_start,
                                       int vocab_end, mc_dtype dt) {
    const ptrdiff_t slices = (C + MC__COL_SLICE - 1) / MC__COL_SLICE;
    const int nt = mc__par_threads((size_t)slices, (size_t)N * MC__COL_SLICE);
    const float *dy = (const float *)dout;
    ptrdiff_t sl;
    if (dt != MC_F32 || nt == 1)
        return mc__cpu_embedding_backward(o, dtable, dout, ids, N, C, vocab_start, vocab_end, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (sl = 0; sl < slices; sl++) {
        const int c0 = (int)sl * MC__COL_SLICE;
        const int c1 = c0 + MC__COL_SLICE < C ? c0 + MC__COL_SLICE : C;
        int n, c;
        for (n = 0; n < N; n++) {
            const int id = ids[n];
            if (id < vocab_start || id >= vocab_end) continue;
            for (c = c0; c < c1; c++)
                dtable[(size_t)(id - vocab_start) * C + c] += dy[(size_t)n * C + c];
        }
    }
    return MC_OK;
}

/* The row-wise cross-entropy pieces: the reference op on a block of rows at a time. */
#define MC__FAST_ROWS 16

static int mc__fast_row_max(const mc_ops *o, float *max, const void *logits, int N, int V,
                            mc_dtype dt) {
    const ptrdiff_t blocks = (N + MC__FAST_ROWS - 1) / MC__FAST_ROWS;
    const int nt = mc__par_threads((size_t)blocks, (size_t)MC__FAST_ROWS * V);
    ptrdiff_t k;
    if (dt != MC_F32 || nt == 1) return mc__cpu_row_max(o, max, logits, N, V, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (k = 0; k < blocks; k++) {
        const int r0 = (int)k * MC__FAST_ROWS, nr = N - r0 < MC__FAST_ROWS ? N - r0 : MC__FAST_ROWS;
        (void)mc__cpu_row_max(o, max + r0, (const float *)logits + (size_t)r0 * V, nr, V, MC_F32);
    }
    return MC_OK;
}

static int mc__fast_sum_exp(const mc_ops *o, float *sum, const void *logits, const float *max,
                            int N, int V, mc_dtype dt) {
    const ptrdiff_t blocks = (N + MC__FAST_ROWS - 1) / MC__FAST_ROWS;
    const int nt = mc__par_threads((size_t)blocks, (size_t)MC__FAST_ROWS * V * 8);
    ptrdiff_t k;
    if (dt != MC_F32 || nt == 1) return mc__cpu_sum_exp(o, sum, logits, max, N, V, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (k = 0; k < blocks; k++) {
        const int r0 = (int)k * MC__FAST_ROWS, nr = N - r0 < MC__FAST_ROWS ? N - r0 : MC__FAST_ROWS;
        (void)mc__cpu_sum_exp(o, sum + r0, (const float *)logits + (size_t)r0 * V, max + r0, nr,
                              V, MC_F32);
    }
    return MC_OK;
}

static int mc__fast_row_sum(const mc_ops *o, float *sum, const void *logits, int N, int V,
                            mc_dtype dt) {
    const ptrdiff_t blocks = (N + MC__FAST_ROWS - 1) / MC__FAST_ROWS;
    const int nt = mc__par_threads((size_t)blocks, (size_t)MC__FAST_ROWS * V);
    ptrdiff_t k;
    if (dt != MC_F32 || nt == 1) return mc__cpu_row_sum(o, sum, logits, N, V, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (k = 0; k < blocks; k++) {
        const int r0 = (int)k * MC__FAST_ROWS, nr = N - r0 < MC__FAST_ROWS ? N - r0 : MC__FAST_ROWS;
        (void)mc__cpu_row_sum(o, sum + r0, (const float *)logits + (size_t)r0 * V, nr, V, MC_F32);
    }
    return MC_OK;
}

static int mc__fast_cross_entropy_backward(const mc_ops *o, void *dlogits, const void *logits,
                                           const float *max, const float *sum,
                                           const int *targets, const float *dloss, int N, int V,
                                           int vocab_start, float smoothing, int vocab_global,
                                           mc_dtype dt) {
    const ptrdiff_t blocks = (N + MC__FAST_ROWS - 1) / MC__FAST_ROWS;
    const int nt = mc__par_threads((size_t)blocks, (size_t)MC__FAST_ROWS * V * 8);
    ptrdiff_t k;
    if (dt != MC_F32 || nt == 1)
        return mc__cpu_cross_entropy_backward(o, dlogits, logits, max, sum, targets, dloss, N, V,
                                              vocab_start, smoothing, vocab_global, dt);
    MC__OMP(parallel for num_threads(nt) schedule(static))
    for (k = 0; k < blocks; k++) {
        const int r0 = (int)k * MC__FAST_ROWS, nr = N - r0 < MC__FAST_ROWS ? N - r0 : MC__FAST_ROWS;
        const size_t at = (size_t)r0 * V;
        (void)mc__cpu_cross_entropy_backward(o, (float *)dlogits + at, (const float *)logits + at,
                                             max + r0, sum + r0, targets + r0, dloss + r0, nr, V,
                                             vocab_start, smoothing, vocab_global, MC_F32);
    }
    return MC_OK;
}

/* AdamW: the reference's update, each span's elements split across the threads. */
static int mc__fast_adamw(const mc_ops *o, float *main, const float *grad, float *m, float *v,
                          void *model_param, const mc_adamw_span *spans, int n_spans,
                          const mc_adamw_step *h, mc_dtype model_dt) {
    const float beta1 = h->beta1, beta2 = h->beta2, lr = h->lr, eps = h->eps;
    const float bc1 = (float)(1.0 - pow((double)beta1, (double)h->step));
    const float bc2 = (float)(1.0 - pow((double)beta2, (double)h->step));
    int k, rc;
    if (model_param && model_dt != MC_F32)
        return mc__cpu_adamw(o, main, grad, m, v, model_param, spans, n_spans, h, model_dt);
    for (k = 0; k < n_spans; k++) {
        const mc_adamw_span *sp = &spans[k];
        const float weight_decay = sp->weight_decay;
        const float *gr = grad + sp->grad_at;
        float *p = main + sp->main_at, *mk = m + sp->state_at, *vk = v + sp->state_at;
        const int nt = mc__par_threads(sp->n, 4);
        ptrdiff_t i;
        (void)nt;
        MC__OMP(parallel for num_threads(nt) schedule(static))
        for (i = 0; i < (ptrdiff_t)sp->n; i++) {
            const float g = gr[i];
            const float mi = beta1 * mk[i] + (1.0f - beta1) * g;
            const float vi = beta2 * vk[i] + (1.0f - beta2) * g * g;
            const float m_hat = mi / bc1, v_hat = vi / bc2;
            mk[i] = mi;
            vk[i] = vi;
            p[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * p[i]);
        }
        if (model_param) {
            float *dst = (float *)model_param + sp->grad_at;
            if (dst != p && (rc = mc__fast_copy(o, dst, p, sp->n, MC_F32, MC_F32)) != MC_OK)
                return rc;
        }
    }
    return MC_OK;
}

/* The fast table: the reference's memory ops, the fast numerics. */
static const mc_ops mc__cpu_fast_ops = {
    "cpu",
    MC_DEVICE_CPU,
    NULL,
    mc__cpu_alloc,
    mc__cpu_free,
    mc__cpu_copy_bytes,
    mc__cpu_copy_bytes,
    mc__cpu_copy_2d,
    mc__cpu_synchronize,
    mc__fast_fill,
    mc__fast_copy,
    mc__fast_axpy,
    mc__fast_scale,
    mc__fast_sum_squares,
    mc__fast_gemm,
    mc__fast_bias_backward,
    mc__fast_layernorm_forward,
    mc__fast_layernorm_backward,
    mc__fast_gelu_forward,
    mc__fast_gelu_backward,
    mc__cpu_gemm_gelu_forward,   /* gemm then gelu_forward of this table */
    mc__cpu_gemm_gelu_backward,
    mc__cpu_attention_stats,
    mc__fast_attention_forward,
    mc__fast_attention_backward,
    mc__fast_dropout_forward,
    mc__fast_dropout_backward,
    mc__cpu_check_ids,
    mc__cpu_embedding_forward,
    mc__fast_embedding_backward,
    mc__fast_row_max,
    mc__cpu_target_logit,
    mc__fast_sum_exp,
    mc__fast_row_sum,
    mc__cpu_cross_entropy_loss,
    mc__fast_cross_entropy_backward,
    mc__fast_adamw,
    NULL, /* no account: give a copy of the table one */
    NULL, /* no completion markers: a CPU op has finished when it returns */
    NULL,
    NULL,
};

/* MC_CPU_REFERENCE=1 in the environment makes mc_ops_cpu() the reference table. */
static int mc__cpu_reference_env(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *v = getenv("MC_CPU_REFERENCE");
        cached = v && *v && strcmp(v, "0") != 0;
    }
    return cached;
}

MC_API const mc_ops *mc_ops_cpu_reference(void) { return &mc__cpu_ops; }
MC_API const mc_ops *mc_ops_cpu_fast(void) { return &mc__cpu_fast_ops; }
MC_API const mc_ops *mc_ops_cpu(void) {
    return mc__cpu_reference_env() ? &mc__cpu_ops : &mc__cpu_fast_ops;
}

MC_API const mc_ops *mc_ops_cpu_cblas(void) {
#if defined(MC_WITH_CBLAS)
    return &mc__cpu_cblas_ops;
#else
    return NULL;
#endif
}

// >>core.ops memory accounting

static const char *const mc__memory_category_names[MC_MEMORY_CATEGORY_COUNT] = {
    "parameters", "gradients", "optimizer", "activations", "communication"};

MC_API const char *mc_memory_category_name(int category) {
    return category >= 0 && category < MC_MEMORY_CATEGORY_COUNT
               ? mc__memory_category_names[category] : "unknown";
}

/* One live block; ptr NULL: never used, MC__ACCOUNT_GONE: freed (keeps probe chains intact). */
typedef struct mc__account_slot {
    const void *ptr;
    size_t bytes;
    int category;
} mc__account_slot;

static const char mc__account_gone_mark = 0;
#define MC__ACCOUNT_GONE ((const void *)&mc__account_gone_mark)

static size_t mc__account_hash(const void *p, size_t n_slots) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdULL, x ^= x >> 33;   /* murmur3's finaliser */
    return (size_t)(x & (uint64_t)(n_slots - 1));
}

/* The slot holding p, or NULL. */
static mc__account_slot *mc__account_find(mc_memory_account *a, const void *p) {
    mc__account_slot *slots = (mc__account_slot *)a->slots;
    size_t i, k;
    if (!slots) return NULL;
    for (i = mc__account_hash(p, a->n_slots), k = 0; k < a->n_slots; k++) {
        mc__account_slot *s = &slots[(i + k) & (a->n_slots - 1)];
        if (s->ptr == p) return s;
        if (!s->ptr) return NULL;
    }
    return NULL;
}

static void mc__account_put(mc__account_slot *slots, size_t n_slots, const mc__account_slot *e) {
    size_t i = mc__account_hash(e->ptr, n_slots);
    while (slots[i].ptr && slots[i].ptr != MC__ACCOUNT_GONE) i = (i + 1) & (n_slots - 1);
    slots[i] = *e;
}

/* Keeps the table at most half full (freed slots count as used until the next rebuild). */
static int mc__account_reserve(mc_memory_account *a) {
    mc__account_slot *old = (mc__account_slot *)a->slots, *grown;
    size_t n = a->n_slots ? a->n_slots : 64, i;
    if (old && 2 * (a->n_used + 1) <= a->n_slots) return MC_OK;
    while (2 * ((size_t)a->blocks + 1) > n / 2) n *= 2;   /* live blocks fill at most a quarter */
    grown = (mc__account_slot *)mc_calloc(n, sizeof *grown);
    if (!grown) return MC__FAIL(MC_ERR_NO_MEMORY, "memory account: no host memory for %zu slots", n);
    for (i = 0; old && i < a->n_slots; i++)
        if (old[i].ptr && old[i].ptr != MC__ACCOUNT_GONE) mc__account_put(grown, n, &old[i]);
    mc_free(old);
    a->slots = grown;
    a->n_slots = n;
    a->n_used = (size_t)a->blocks;
    return MC_OK;
}

MC_API int mc_ops_alloc(const mc_ops *o, mc_memory_category category, void **ptr, size_t bytes) {
    mc_memory_account *a;
    mc__account_slot e;
    int rc;
    if (!o || !ptr) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_ops_alloc: table and ptr must be set");
    if ((int)category < 0 || (int)category >= MC_MEMORY_CATEGORY_COUNT)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_ops_alloc: category (%d) is not an "
                        "mc_memory_category", (int)category);
    *ptr = NULL;
    if ((rc = o->alloc(o, ptr, bytes)) != MC_OK) return rc;
    if (!(a = o->account) || !*ptr) return MC_OK;
    if ((rc = mc__account_reserve(a)) != MC_OK) {
        o->free(o, *ptr);
        *ptr = NULL;
        return rc;
    }
    e.ptr = *ptr, e.bytes = bytes, e.category = (int)category;
    mc__account_put((mc__account_slot *)a->slots, a->n_slots, &e);
    a->n_used++;
    a->blocks++;
    a->bytes[category] += (double)bytes;
    a->total += (double)bytes;
    if (a->bytes[category] > a->peak[category]) a->peak[category] = a->bytes[category];
    if (a->total > a->peak_total) a->peak_total = a->total;
    return MC_OK;
}

MC_API int mc_ops_free(const mc_ops *o, void *ptr) {
    mc__account_slot *s;
    if (!o || !ptr) return MC_OK;
    if (o->account && (s = mc__account_find(o->account, ptr)) != NULL) {
        o->account->bytes[s->category] -= (double)s->bytes;
        o->account->total -= (double)s->bytes;
        o->account->blocks--;
        s->ptr = MC__ACCOUNT_GONE;
    }
    return o->free(o, ptr);
}

MC_API void mc_memory_account_reset_peaks(mc_memory_account *a) {
    int c;
    if (!a) return;
    for (c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++) a->peak[c] = a->bytes[c];
    a->peak_total = a->total;
}

MC_API void mc_memory_account_destroy(mc_memory_account *a) {
    if (!a) return;
    mc_free(a->slots);
    memset(a, 0, sizeof *a);
}

/* Op-table memory of `category` as a pointer, or NULL with the error recorded (for the
   callers' NULL checks). */
static void *mc__ops_alloc(const mc_ops *o, mc_memory_category category, size_t bytes) {
    void *p = NULL;
    if (!o || mc_ops_alloc(o, category, &p, bytes) != MC_OK) return NULL;
    return p;
}

static void mc__ops_free(const mc_ops *o, void *p) {
    if (o && p) mc_ops_free(o, p);
}

/* @ops:implementation end */

/* @timeline:implementation begin */
// ---------------------------------------------------------------------------------------------
// >>core.timeline  (see the declarations). One process-wide pointer; every trace point tests it
// first (MC__TL_ON), so a program without a timeline pays one load and one branch per point.

#include <time.h>

static mc_timeline *mc__tl = NULL;
#define MC__TL_ON (mc__tl != NULL)

MC_API double mc_timeline_now(void) {
#if defined(CLOCK_MONOTONIC)
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#elif defined(MC_COMM_MPI)
    return MPI_Wtime();
#elif defined(TIME_UTC)
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#else
    return (double)clock() / (double)CLOCKS_PER_SEC;   /* processor time: a poor last resort */
#endif
}

MC_API const char *mc_timeline_kind_name(int kind) {
    static const char *const names[MC_TIMELINE_KIND_COUNT] = {"span",  "compute", "collective",
                                                              "async", "wait",    "mark"};
    return kind >= 0 && kind < MC_TIMELINE_KIND_COUNT ? names[kind] : "?";
}

static mc_timeline_event *mc__tl_find(const mc_timeline *tl, long long id) {
    if (!tl || id < 0 || id >= tl->n_events || id < tl->n_events - tl->desc.capacity) return NULL;
    return &tl->desc.events[id % tl->desc.capacity];
}

/* Waits for the event's marker and takes its time as the completion. */
static int mc__tl_resolve(mc_timeline_event *e) {
    double t = 0.0;
    int rc = MC_OK;
    if (!e->mark) return MC_OK;
    if (e->mark_ops) {
        rc = e->mark_ops->mark_time(e->mark_ops, e->mark, &t);
        if (e->mark_ops->mark_release) e->mark_ops->mark_release(e->mark_ops, e->mark);
    } else if (e->mark_comm) {
        rc = e->mark_comm->ops->mark_time(e->mark_comm, e->mark, &t);
        if (e->mark_comm->ops->mark_release) e->mark_comm->ops->mark_release(e->mark_comm, e->mark);
    }
    e->mark = NULL;
    e->mark_ops = NULL;
    e->mark_comm = NULL;
    /* a marker that failed leaves what the host saw */
    e->t_complete = rc == MC_OK ? t : (e->kind == MC_TIMELINE_ASYNC ? 0.0 : e->t_return);
    return rc;
}

/* A new event (pushed on the open stack when it encloses others). -1 while nothing records. */
static long long mc__tl_open(mc_timeline_kind kind, const char *name, int index, int chunk,
                             const mc_comm *c, size_t bytes, int encloses) {
    mc_timeline *tl = mc__tl;
    mc_timeline_event *e;
    long long id;
    if (!tl) return -1;
    id = tl->n_events++;
    e = &tl->desc.events[id % tl->desc.capacity];
    if (e->mark && id >= tl->desc.capacity) mc__tl_resolve(e);   /* the overwritten event's */
    memset(e, 0, sizeof *e);
    e->id = id;
    e->kind = kind;
    snprintf(e->name, sizeof e->name, "%s", name ? name : "");
    if (c) snprintf(e->comm, sizeof e->comm, "%s", c->name);
    e->index = index;
    e->chunk = chunk;
    e->depth = tl->depth;
    e->parent = tl->depth > 0 ? tl->open[tl->depth - 1] : -1;
    e->ref = -1;
    e->bytes = bytes;
    e->t_call = mc_timeline_now();
    if (encloses && tl->depth < MC_TIMELINE_MAX_DEPTH) tl->open[tl->depth++] = id;
    return id;
}

/* The call of event `id` returned with `status`: its return time, the open stack popped down
   to it, and its completion (now, or a marker on the op table or the communicator; async
   operations complete later). */
static void mc__tl_close(long long id, int status, const mc_ops *ops, mc_comm *c) {
    mc_timeline *tl = mc__tl;
    mc_timeline_event *e = mc__tl_find(tl, id);
    void *mark = NULL;
    int k;
    if (!e) return;
    e->t_return = mc_timeline_now();
    e->status = status;
    for (k = tl->depth - 1; k >= 0; k--)
        if (tl->open[k] == id) {
            /* spans opened inside it and left open end with it */
            while (tl->depth > k + 1) {
                mc_timeline_event *inner = mc__tl_find(tl, tl->open[--tl->depth]);
                if (inner && inner->t_return == 0.0) {
                    inner->t_return = e->t_return;
                    if (!inner->mark) inner->t_complete = e->t_return;
                }
            }
            tl->depth = k;
            break;
        }
    if (status == MC_OK && ops && ops->mark_record && ops->mark_time &&
        ops->mark_record(ops, &mark) == MC_OK && mark) {
        e->mark = mark;
        e->mark_ops = ops;
    } else if (status == MC_OK && c && c->ops && c->ops->mark_record && c->ops->mark_time &&
               c->ops->mark_record(c, &mark) == MC_OK && mark) {
        e->mark = mark;
        e->mark_comm = c;
    } else if (e->kind != MC_TIMELINE_ASYNC) {
        e->t_complete = e->t_return;
    }
}

/* A wait or a test found async event `id` finished at time t. */
static void mc__tl_async_done(long long id, double t) {
    mc_timeline_event *e = mc__tl_find(mc__tl, id);
    if (e && e->kind == MC_TIMELINE_ASYNC && !e->mark && e->t_complete == 0.0) e->t_complete = t;
}

MC_API int mc_timeline_start(mc_timeline *tl, const mc_timeline_desc *desc) {
    if (!tl || !desc)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_timeline_start: tl and desc must be set");
    if (!desc->events)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_timeline_desc.events is required (the ring)");
    if (desc->capacity < 1)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_timeline_desc.capacity (%d) must be >= 1",
                        desc->capacity);
    if (mc__tl) mc_timeline_stop(mc__tl);
    memset(tl, 0, sizeof *tl);
    tl->desc = *desc;
    memset(desc->events, 0, sizeof *desc->events * (size_t)desc->capacity);
    tl->recording = 1;
    mc__tl = tl;
    return MC_OK;
}

MC_API int mc_timeline_flush(mc_timeline *tl) {
    long long id, first;
    int rc = MC_OK, r;
    if (!tl) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_timeline_flush: tl is NULL");
    first = mc_timeline_first(tl);
    for (id = first; id < tl->n_events; id++) {
        mc_timeline_event *e = &tl->desc.events[id % tl->desc.capacity];
        if (e->mark && (r = mc__tl_resolve(e)) != MC_OK && rc == MC_OK) rc = r;
    }
    /* children before parents (a child's id is larger): a span completes with its synchronous
       events, never with the asynchronous operations it started */
    for (id = tl->n_events - 1; id >= first; id--) {
        const mc_timeline_event *e = &tl->desc.events[id % tl->desc.capacity];
        mc_timeline_event *p = mc__tl_find(tl, e->parent);
        if (p && e->kind != MC_TIMELINE_ASYNC && p->t_return > 0.0 && e->t_complete > p->t_complete)
            p->t_complete = e->t_complete;
    }
    return rc;
}

MC_API int mc_timeline_stop(mc_timeline *tl) {
    int rc;
    if (!tl) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_timeline_stop: tl is NULL");
    rc = mc_timeline_flush(tl);
    tl->recording = 0;
    tl->depth = 0;
    if (mc__tl == tl) mc__tl = NULL;
    return rc;
}

MC_API long long mc_timeline_first(const mc_timeline *tl) {
    if (!tl) return 0;
    return tl->n_events > tl->desc.capacity ? tl->n_events - tl->desc.capacity : 0;
}

MC_API const mc_timeline_event *mc_timeline_event_at(const mc_timeline *tl, long long id) {
    return mc__tl_find(tl, id);
}

MC_API long long mc_timeline_begin(const char *name, int index) {
    return MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, name, index, -1, NULL, 0, 1) : -1;
}

MC_API void mc_timeline_end(long long span, const struct mc_ops *ops) {
    if (MC__TL_ON && span >= 0) mc__tl_close(span, MC_OK, ops, NULL);
}

MC_API void mc_timeline_mark(const char *name, int index) {
    long long id;
    if (!MC__TL_ON) return;
    id = mc__tl_open(MC_TIMELINE_MARK, name, index, -1, NULL, 0, 0);
    mc__tl_close(id, MC_OK, NULL, NULL);
}

/* A communicator about to be destroyed: its pending markers are resolved first. */
static void mc__tl_forget_comm(const mc_comm *c) {
    long long id;
    if (!MC__TL_ON) return;
    for (id = mc_timeline_first(mc__tl); id < mc__tl->n_events; id++) {
        mc_timeline_event *e = &mc__tl->desc.events[id % mc__tl->desc.capacity];
        if (e->mark && e->mark_comm == c) mc__tl_resolve(e);
    }
}

/* @timeline:implementation end */

/* @config:implementation begin */
// ---------------------------------------------------------------------------------------------
// >>core.config  Defaults, validation (every violated rule, one line each) and the fingerprints.

MC_API int mc_gpt_padded_vocab_size(int vocab, int divisible_by, int tp) {
    long long multiple, padded;
    if (vocab <= 0 || divisible_by <= 0 || tp <= 0)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_gpt_padded_vocab_size: vocab (%d), make_vocab_size_divisible_by (%d) "
                        "and tensor_model_parallel_size (%d) must be > 0",
                        vocab, divisible_by, tp);
    multiple = (long long)divisible_by * tp;
    padded = ((long long)vocab + multiple - 1) / multiple * multiple;
    if (padded > INT_MAX)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_gpt_padded_vocab_size: vocab (%d) padded to a multiple of %lld "
                        "exceeds INT_MAX",
                        vocab, multiple);
    return (int)padded;
}

/* 0 selects the default; MC_DROPOUT_OFF means 0; in a resolved config 0 stays 0. */
static float mc__resolve_dropout(float p, int resolved) {
    if (p == MC_DROPOUT_OFF) return 0.0f;
    if (p == 0.0f && !resolved) return 0.1f;
    return p;
}

MC_API int mc_gpt_config_resolve(mc_gpt_config *out, const mc_gpt_config *in) {
    mc_gpt_config c;
    int resolved;
    if (!out || !in)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_gpt_config_resolve: out (%p) and in (%p) must be set",
                        (void *)out, (const void *)in);
    c = *in;
    resolved = in->padded_vocab_size != 0;
    c.ffn_hidden_size = MC__DEF(c.ffn_hidden_size, 4 * c.hidden_size);
    c.kv_channels = MC__DEF(c.kv_channels,
                            c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
    c.num_query_groups = MC__DEF(c.num_query_groups, c.num_attention_heads);
    c.make_vocab_size_divisible_by = MC__DEF(c.make_vocab_size_divisible_by, 128);
    c.max_position_embeddings = MC__DEF(c.max_position_embeddings, c.seq_length);
    if (c.layernorm_epsilon == 0.0f) c.layernorm_epsilon = 1e-5f;
    if (c.init_method_std == 0.0f) c.init_method_std = 0.02f;
    c.hidden_dropout = mc__resolve_dropout(c.hidden_dropout, resolved);
    c.attention_dropout = mc__resolve_dropout(c.attention_dropout, resolved);
    c.tensor_model_parallel_size = MC__DEF(c.tensor_model_parallel_size, 1);
    c.pipeline_model_parallel_size = MC__DEF(c.pipeline_model_parallel_size, 1);
    if (c.virtual_pipeline_model_parallel_size == 1) c.virtual_pipeline_model_parallel_size = 0;
    c.seed = MC__DEF(c.seed, 1234);
    c.padded_vocab_size = 0;
    if (c.vocab_size > 0 && c.make_vocab_size_divisible_by > 0 &&
        c.tensor_model_parallel_size > 0) {
        int padded = mc_gpt_padded_vocab_size(c.vocab_size, c.make_vocab_size_divisible_by,
                                              c.tensor_model_parallel_size);
        c.padded_vocab_size = padded > 0 ? padded : 0;
    }
    *out = c;
    return MC_OK;
}

/* A growing report: one line per violation, counted even when the text no longer fits. */
typedef struct mc__report {
    char *buf;
    size_t cap, len;
    int count;
} mc__report;

static void mc__report_add(mc__report *r, const char *fmt, ...) MC__PRINTF(2, 3);
static void mc__report_add(mc__report *r, const char *fmt, ...) {
    va_list ap;
    r->count++;
    if (!r->buf || r->len + 1 >= r->cap) return;
    va_start(ap, fmt);
    vsnprintf(r->buf + r->len, r->cap - r->len, fmt, ap);
    va_end(ap);
    r->len += strlen(r->buf + r->len);
    if (r->len + 1 < r->cap) {
        r->buf[r->len++] = '\n';
        r->buf[r->len] = '\0';
    }
}

static const char *mc__recompute_granularity_name(int g) {
    switch (g) {
        case MC_RECOMPUTE_NONE: return "none";
        case MC_RECOMPUTE_FULL: return "full";
        case MC_RECOMPUTE_SELECTIVE: return "selective";
        default: return "unknown";
    }
}

static const char *mc__recompute_method_name(int m) {
    switch (m) {
        case MC_RECOMPUTE_METHOD_NONE: return "none";
        case MC_RECOMPUTE_UNIFORM: return "uniform";
        case MC_RECOMPUTE_BLOCK: return "block";
        default: return "unknown";
    }
}

static void mc__check_positive(mc__report *r, const char *field, int value, int required) {
    if (value <= 0)
        mc__report_add(r, "%s (%d) %smust be > 0", field, value,
                       required ? "is required and " : "");
}

static void mc__check_dropout(mc__report *r, const char *field, float p) {
    if (!(p >= 0.0f && p < 1.0f))
        mc__report_add(r, "%s (%g) must be in [0, 1) (0 selects 0.1; MC_DROPOUT_OFF switches it "
                       "off)", field, (double)p);
}

/* Sizes and divisibility of the model against TP and PP (§13.2 items 4-6 and 12). */
static void mc__validate_shapes(mc__report *r, const mc_gpt_config *c) {
    const int tp = c->tensor_model_parallel_size, pp = c->pipeline_model_parallel_size;
    const int vpp = c->virtual_pipeline_model_parallel_size, heads = c->num_attention_heads;
    if (tp > 0 && heads > 0 && heads % tp != 0)
        mc__report_add(r, "num_attention_heads (%d) must be divisible by "
                       "tensor_model_parallel_size (%d)", heads, tp);
    if (tp > 0 && c->ffn_hidden_size > 0 && c->ffn_hidden_size % tp != 0)
        mc__report_add(r, "ffn_hidden_size (%d) must be divisible by tensor_model_parallel_size "
                       "(%d)", c->ffn_hidden_size, tp);
    if (heads > 0 && c->kv_channels > 0 && c->hidden_size > 0 &&
        (long long)c->kv_channels * heads != c->hidden_size)
        mc__report_add(r, "kv_channels (%d) x num_attention_heads (%d) = %lld must equal "
                       "hidden_size (%d): the attention projection of this build maps back to "
                       "hidden_size (the default kv_channels is hidden_size / heads)",
                       c->kv_channels, heads, (long long)c->kv_channels * heads, c->hidden_size);
    if (heads > 0 && c->num_query_groups > 0 && c->num_query_groups != heads)
        mc__report_add(r, "num_query_groups (%d) must equal num_attention_heads (%d): grouped-"
                       "query attention is not implemented", c->num_query_groups, heads);
    if (tp > 0 && c->num_query_groups > 0 && c->num_query_groups % tp != 0 &&
        tp % c->num_query_groups != 0)
        mc__report_add(r, "num_query_groups (%d) must be a multiple or a divisor of "
                       "tensor_model_parallel_size (%d)", c->num_query_groups, tp);
    if (pp > 0 && c->num_layers > 0 && c->num_layers % pp != 0)
        mc__report_add(r, "num_layers (%d) must be divisible by pipeline_model_parallel_size (%d)",
                       c->num_layers, pp);
    if (vpp > 0 && pp <= 1)
        mc__report_add(r, "virtual_pipeline_model_parallel_size (%d) needs "
                       "pipeline_model_parallel_size > 1 (it is %d)", vpp, pp);
    if (vpp > 0 && pp > 0 && c->num_layers > 0 && c->num_layers % (pp * vpp) != 0)
        mc__report_add(r, "num_layers (%d) must be divisible by pipeline_model_parallel_size (%d) "
                       "x virtual_pipeline_model_parallel_size (%d) = %d (upstream once divided "
                       "silently and built %d layers: NVIDIA/Megatron-LM #468)",
                       c->num_layers, pp, vpp, pp * vpp, c->num_layers / (pp * vpp) * pp * vpp);
    if (c->sequence_parallel && tp <= 1)
        mc__report_add(r, "sequence_parallel (%d): Cannot use sequence parallelism without tensor "
                       "parallelism (tensor_model_parallel_size is %d)", c->sequence_parallel, tp);
    if (c->sequence_parallel && tp > 1 && c->seq_length > 0 && c->seq_length % tp != 0)
        mc__report_add(r, "seq_length (%d) must be divisible by tensor_model_parallel_size (%d) "
                       "with sequence_parallel (the sequence is split across TP ranks)",
                       c->seq_length, tp);
}

/* §13.2 item 11, with Megatron's arguments.py rule that selective takes no method. */
static void mc__validate_recompute(mc__report *r, const mc_gpt_config *c) {
    const int g = (int)c->recompute_granularity, m = (int)c->recompute_method;
    const int n = c->recompute_num_layers, pp = c->pipeline_model_parallel_size;
    const int per_rank = pp > 0 ? c->num_layers / pp : 0;
    if (g < MC_RECOMPUTE_NONE || g > MC_RECOMPUTE_SELECTIVE) {
        mc__report_add(r, "recompute_granularity (%d) must be none, full or selective", g);
        return;
    }
    if (m < MC_RECOMPUTE_METHOD_NONE || m > MC_RECOMPUTE_BLOCK) {
        mc__report_add(r, "recompute_method (%d) must be none, uniform or block", m);
        return;
    }
    if (g == MC_RECOMPUTE_FULL) {
        if (m == MC_RECOMPUTE_METHOD_NONE)
            mc__report_add(r, "recompute_method (none): recompute_granularity full needs "
                           "recompute_method uniform or block");
        if (n < 1 || (per_rank > 0 && n > per_rank))
            mc__report_add(r, "recompute_num_layers (%d) must be between 1 and "
                           "num_layers_per_pipeline_rank (%d) with recompute_granularity full",
                           n, per_rank);
    } else if (g == MC_RECOMPUTE_SELECTIVE) {
        if (m != MC_RECOMPUTE_METHOD_NONE)
            mc__report_add(r, "recompute_method (%s) is not supported with "
                           "recompute_granularity selective", mc__recompute_method_name(m));
        if (n != 0)
            mc__report_add(r, "recompute_num_layers (%d) must be 0 (None) with "
                           "recompute_granularity selective", n);
    } else {
        if (m != MC_RECOMPUTE_METHOD_NONE || n != 0)
            mc__report_add(r, "recompute_method (%s) and recompute_num_layers (%d) need "
                           "recompute_granularity full (granularity is %s)",
                           mc__recompute_method_name(m), n, mc__recompute_granularity_name(g));
    }
}

MC_API int mc_gpt_config_validate(const mc_gpt_config *cfg, char *report, size_t report_cap) {
    mc_gpt_config c;
    mc__report r;
    r.buf = report_cap > 0 ? report : NULL;
    r.cap = report_cap;
    r.len = 0;
    r.count = 0;
    if (r.buf) r.buf[0] = '\0';
    if (!cfg) {
        mc__report_add(&r, "config (NULL) must be given");
        return r.count;
    }
    mc_gpt_config_resolve(&c, cfg);
    mc__check_positive(&r, "num_layers", c.num_layers, 1);
    mc__check_positive(&r, "hidden_size", c.hidden_size, 1);
    mc__check_positive(&r, "num_attention_heads", c.num_attention_heads, 1);
    mc__check_positive(&r, "seq_length", c.seq_length, 1);
    mc__check_positive(&r, "vocab_size", c.vocab_size, 1);
    mc__check_positive(&r, "micro_batch_size", c.micro_batch_size, 1);
    if (c.hidden_size > 0) mc__check_positive(&r, "ffn_hidden_size", c.ffn_hidden_size, 0);
    if (c.hidden_size > 0 && c.num_attention_heads > 0)
        mc__check_positive(&r, "kv_channels", c.kv_channels, 0);
    if (c.num_attention_heads > 0)
        mc__check_positive(&r, "num_query_groups", c.num_query_groups, 0);
    mc__check_positive(&r, "make_vocab_size_divisible_by", c.make_vocab_size_divisible_by, 0);
    if (c.seq_length > 0)
        mc__check_positive(&r, "max_position_embeddings", c.max_position_embeddings, 0);
    mc__check_positive(&r, "tensor_model_parallel_size", c.tensor_model_parallel_size, 0);
    mc__check_positive(&r, "pipeline_model_parallel_size", c.pipeline_model_parallel_size, 0);
    if (c.virtual_pipeline_model_parallel_size < 0 ||
        c.virtual_pipeline_model_parallel_size > MC_MAX_VPP)
        mc__report_add(&r, "virtual_pipeline_model_parallel_size (%d) must be in [0, %d]",
                       c.virtual_pipeline_model_parallel_size, MC_MAX_VPP);
    mc__validate_shapes(&r, &c);
    mc__validate_recompute(&r, &c);
    mc__check_dropout(&r, "hidden_dropout", c.hidden_dropout);
    mc__check_dropout(&r, "attention_dropout", c.attention_dropout);
    if (!(c.layernorm_epsilon > 0.0f))
        mc__report_add(&r, "layernorm_epsilon (%g) must be > 0", (double)c.layernorm_epsilon);
    if (!(c.init_method_std > 0.0f))
        mc__report_add(&r, "init_method_std (%g) must be > 0", (double)c.init_method_std);
    if (c.seed <= 0) mc__report_add(&r, "seed (%d) must be > 0", c.seed);
    if (c.seq_length > 0 && c.max_position_embeddings > 0 &&
        c.max_position_embeddings < c.seq_length)
        mc__report_add(&r, "max_position_embeddings (%d) must be >= seq_length (%d)",
                       c.max_position_embeddings, c.seq_length);
    return r.count;
}

/* The fingerprinted fields, by name and offset, so that the hash and the diff list the same
   fields. A flag is hashed as 0/1. */
enum { MC__CFG_INT = 0, MC__CFG_FLOAT, MC__CFG_FLAG };
typedef struct mc__cfg_field {
    const char *name;
    size_t offset;
    int kind;
} mc__cfg_field;

#define MC__CFG_FIELD(name, kind) {#name, offsetof(mc_gpt_config, name), kind}
static const mc__cfg_field mc__cfg_math_fields[] = {
    MC__CFG_FIELD(num_layers, MC__CFG_INT),
    MC__CFG_FIELD(hidden_size, MC__CFG_INT),
    MC__CFG_FIELD(num_attention_heads, MC__CFG_INT),
    MC__CFG_FIELD(ffn_hidden_size, MC__CFG_INT),
    MC__CFG_FIELD(kv_channels, MC__CFG_INT),
    MC__CFG_FIELD(num_query_groups, MC__CFG_INT),
    MC__CFG_FIELD(vocab_size, MC__CFG_INT),
    MC__CFG_FIELD(make_vocab_size_divisible_by, MC__CFG_INT),
    MC__CFG_FIELD(max_position_embeddings, MC__CFG_INT),
    MC__CFG_FIELD(layernorm_epsilon, MC__CFG_FLOAT),
    MC__CFG_FIELD(untie_embeddings_and_output_weights, MC__CFG_FLAG),
};
static const mc__cfg_field mc__cfg_layout_fields[] = {
    MC__CFG_FIELD(tensor_model_parallel_size, MC__CFG_INT),
    MC__CFG_FIELD(pipeline_model_parallel_size, MC__CFG_INT),
    MC__CFG_FIELD(virtual_pipeline_model_parallel_size, MC__CFG_INT),
    MC__CFG_FIELD(sequence_parallel, MC__CFG_FLAG),
};
#undef MC__CFG_FIELD

/* The field's value as 64 bits: ints sign-extended, floats by their bit pattern. */
static uint64_t mc__cfg_bits(const mc_gpt_config *c, const mc__cfg_field *f) {
    const char *base = (const char *)c + f->offset;
    if (f->kind == MC__CFG_FLOAT) {
        uint32_t bits;
        memcpy(&bits, base, sizeof bits);
        return bits;
    } else {
        int v;
        memcpy(&v, base, sizeof v);
        if (f->kind == MC__CFG_FLAG) v = v != 0;
        return (uint64_t)(int64_t)v;
    }
}

static uint64_t mc__cfg_hash(const mc_gpt_config *cfg, const char *tag,
                             const mc__cfg_field *fields, size_t n) {
    mc_gpt_config c;
    uint64_t h = mc__fnv_bytes(MC__FNV_OFFSET, tag, strlen(tag));
    size_t i;
    if (!cfg) return 0;
    mc_gpt_config_resolve(&c, cfg);
    for (i = 0; i < n; i++) {
        h = mc__fnv_bytes(h, fields[i].name, strlen(fields[i].name) + 1);
        h = mc__fnv_int(h, mc__cfg_bits(&c, &fields[i]));
    }
    return h;
}

MC_API uint64_t mc_gpt_config_math_fingerprint(const mc_gpt_config *cfg) {
    return mc__cfg_hash(cfg, "mc_gpt_config math v1", mc__cfg_math_fields,
                        MC__COUNTOF(mc__cfg_math_fields));
}

MC_API uint64_t mc_gpt_config_layout_fingerprint(const mc_gpt_config *cfg) {
    return mc__cfg_hash(cfg, "mc_gpt_config layout v1", mc__cfg_layout_fields,
                        MC__COUNTOF(mc__cfg_layout_fields));
}

static void mc__cfg_format(char *out, size_t cap, const mc_gpt_config *c,
                           const mc__cfg_field *f) {
    const char *base = (const char *)c + f->offset;
    if (f->kind == MC__CFG_FLOAT) {
        float v;
        memcpy(&v, base, sizeof v);
        snprintf(out, cap, "%g", (double)v);
    } else {
        int v;
        memcpy(&v, base, sizeof v);
        snprintf(out, cap, "%d", f->kind == MC__CFG_FLAG ? v != 0 : v);
    }
}

MC_API int mc_gpt_config_math_diff(const mc_gpt_config *a, const mc_gpt_config *b, char *out,
                                   size_t cap) {
    mc_gpt_config ra, rb;
    size_t i, len = 0;
    int count = 0;
    if (out && cap > 0) out[0] = '\0';
    if (!a || !b) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_gpt_config_math_diff: a (%p) and b (%p) "
                                  "must be set", (const void *)a, (const void *)b);
    mc_gpt_config_resolve(&ra, a);
    mc_gpt_config_resolve(&rb, b);
    for (i = 0; i < MC__COUNTOF(mc__cfg_math_fields); i++) {
        const mc__cfg_field *f = &mc__cfg_math_fields[i];
        char va[32], vb[32];
        if (mc__cfg_bits(&ra, f) == mc__cfg_bits(&rb, f)) continue;
        mc__cfg_format(va, sizeof va, &ra, f);
        mc__cfg_format(vb, sizeof vb, &rb, f);
        if (out && len + 1 < cap) {
            snprintf(out + len, cap - len, "%s%s: %s vs %s", count ? "; " : "", f->name, va, vb);
            len += strlen(out + len);
        }
        count++;
    }
    return count;
}

/* @config:implementation end */

// ---------------------------------------------------------------------------------------------
// >>core.num_microbatches
//
// Megatron's calculators in C. The ramp-up follows core_v0.17 (the last release that has it),
// the step schedule follows HEAD. Megatron asserts; here every rule is an MC_ERR_INVALID_DESC
// whose message names the values.

/* MBS * DP, the samples one micro-batch step takes over all data-parallel replicas. */
static int mc__microbatch_unit(const mc_microbatch_calc *c) {
    return c->desc.micro_batch_size * c->desc.data_parallel_size;
}

/* Sets the current batch and derives the running batch and the micro-batch count from it. */
static int mc__microbatch_apply(mc_microbatch_calc *c, int batch, int consistency_check) {
    int unit = mc__microbatch_unit(c);
    if (consistency_check && !c->desc.decrease_batch_size_if_needed && batch % unit != 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "current global batch size (%d) is not divisible by micro batch size "
                        "(%d) times data parallel size (%d) = %d",
                        batch, c->desc.micro_batch_size, c->desc.data_parallel_size, unit);
    c->current_global_batch_size = batch;
    c->current_running_global_batch_size =
        c->desc.decrease_batch_size_if_needed ? batch / unit * unit : batch;
    c->num_microbatches = c->current_running_global_batch_size / unit;
    return MC_OK;
}

static int mc__microbatch_check_sizes(const mc_microbatch_desc *d) {
    if (d->micro_batch_size <= 0)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_microbatch_desc.micro_batch_size (%d) must be > 0",
                        d->micro_batch_size);
    if (d->data_parallel_size <= 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.data_parallel_size (%d) must be > 0",
                        d->data_parallel_size);
    if ((long long)d->micro_batch_size * d->data_parallel_size > INT_MAX)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "micro batch size (%d) times data parallel size (%d) overflows an int",
                        d->micro_batch_size, d->data_parallel_size);
    return MC_OK;
}

static int mc__microbatch_init_constant(mc_microbatch_calc *c) {
    const mc_microbatch_desc *d = &c->desc;
    int unit = mc__microbatch_unit(c);
    if (!d->decrease_batch_size_if_needed && d->global_batch_size % unit != 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "global batch size (%d) is not divisible by micro batch size (%d) times "
                        "data parallel size (%d) = %d (GBS = MBS x num_microbatches x DP; or set "
                        "decrease_batch_size_if_needed)",
                        d->global_batch_size, d->micro_batch_size, d->data_parallel_size, unit);
    if (d->global_batch_size / unit < 1)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "number of microbatches should be at least 1, got 0: global batch size "
                        "(%d) is below micro batch size (%d) times data parallel size (%d) = %d",
                        d->global_batch_size, d->micro_batch_size, d->data_parallel_size, unit);
    c->mode = MC_MICROBATCH_CONSTANT;
    c->global_batch_size = d->global_batch_size;
    return mc__microbatch_apply(c, d->global_batch_size, 0);
}

static int mc__microbatch_init_rampup(mc_microbatch_calc *c) {
    const mc_microbatch_desc *d = &c->desc;
    const mc_rampup *r = &d->rampup;
    int n_inc;
    /* Megatron's asserts, in its order. */
    if (r->start <= 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.rampup.start (%d): start batch size should be positive",
                        r->start);
    if (r->increment <= 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.rampup.increment (%d): batch size increment should be "
                        "positive",
                        r->increment);
    if (r->samples < 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.rampup.samples (%lld): ramp-up samples should be "
                        "non-negative",
                        r->samples);
    if (d->global_batch_size < r->start)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "expected global batch size (%d) to be greater than or equal to the "
                        "ramp-up start batch size (%d)",
                        d->global_batch_size, r->start);
    if ((d->global_batch_size - r->start) % r->increment != 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "expected the global batch size interval GBS - start = %d - %d = %d to be "
                        "divisible by the batch size increment (%d)",
                        d->global_batch_size, r->start, d->global_batch_size - r->start,
                        r->increment);
    n_inc = (d->global_batch_size - r->start) / r->increment;
    /* Megatron computes samples / n_inc and later consumed / that: both divide by zero in the
       two cases below. GBS == start is a ramp-up with nothing to ramp, so it runs at GBS. */
    if (n_inc > 0 && r->samples == 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.rampup.samples (0) must be > 0 when the batch grows "
                        "from %d to %d (Megatron divides by zero here)",
                        r->start, d->global_batch_size);
    c->rampup_samples_per_increment = n_inc > 0 ? (double)r->samples / (double)n_inc : 0.0;
    c->mode = MC_MICROBATCH_RAMPUP;
    c->global_batch_size = d->global_batch_size;
    return mc_microbatch_update(c, 0, 0);
}

/* A number with an optional K/M/B/T suffix (either case), decimals allowed: "250B", "1.5k". */
static int mc__parse_scaled(const char *text, size_t len, long long *out) {
    char buf[64], *end;
    double value, scale = 1.0;
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, text, len);
    buf[len] = '\0';
    switch (buf[len - 1]) {
        case 'K': case 'k': scale = 1e3; break;
        case 'M': case 'm': scale = 1e6; break;
        case 'B': case 'b': scale = 1e9; break;
        case 'T': case 't': scale = 1e12; break;
        default: break;
    }
    if (scale != 1.0) buf[--len] = '\0';
    if (len == 0 || !((buf[0] >= '0' && buf[0] <= '9') || buf[0] == '-' || buf[0] == '+' ||
                      buf[0] == '.'))
        return -1;   /* also keeps strtod away from "inf", "nan" and hex floats */
    value = strtod(buf, &end);
    if (*end != '\0') return -1;
    value *= scale;
    if (!(value > -9.2e18 && value < 9.2e18)) return -1;
    *out = (long long)value;   /* truncates toward zero, like Python's int(float) */
    return 0;
}

/* One "THRESHOLD:BS" entry of length len. */
static int mc__parse_step_entry(mc_microbatch_calc *c, const char *entry, size_t len) {
    const char *colon = (const char *)memchr(entry, ':', len);
    long long threshold, batch;
    size_t head;
    if (!colon)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.step_schedule: invalid entry \"%.*s\", expected "
                        "THRESHOLD:BATCH_SIZE",
                        (int)len, entry);
    head = (size_t)(colon - entry);
    if (mc__parse_scaled(entry, head, &threshold) != 0 ||
        mc__parse_scaled(colon + 1, len - head - 1, &batch) != 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.step_schedule: entry \"%.*s\" is not two numbers "
                        "(THRESHOLD:BATCH_SIZE, each with an optional K, M, B or T suffix)",
                        (int)len, entry);
    if (c->n_steps == MC_MAX_BATCH_STEPS)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.step_schedule has more than MC_MAX_BATCH_STEPS (%d) "
                        "entries",
                        MC_MAX_BATCH_STEPS);
    if (batch > INT_MAX)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.step_schedule: batch size %lld in \"%.*s\" does not "
                        "fit in an int",
                        batch, (int)len, entry);
    /* Python's // floors; thresholds below 0 fail the first-threshold rule either way. */
    if (c->desc.seq_length > 0) {
        long long q = threshold / c->desc.seq_length;
        if (threshold % c->desc.seq_length != 0 && threshold < 0) q--;
        threshold = q;
    }
    c->step_threshold[c->n_steps] = threshold;
    c->step_batch[c->n_steps] = (int)batch;
    c->n_steps++;
    return MC_OK;
}

/* Stable insertion sort by threshold: the list is short. */
static void mc__sort_steps(mc_microbatch_calc *c) {
    int i, j;
    for (i = 1; i < c->n_steps; i++) {
        long long t = c->step_threshold[i];
        int b = c->step_batch[i];
        for (j = i; j > 0 && c->step_threshold[j - 1] > t; j--) {
            c->step_threshold[j] = c->step_threshold[j - 1];
            c->step_batch[j] = c->step_batch[j - 1];
        }
        c->step_threshold[j] = t;
        c->step_batch[j] = b;
    }
}

static int mc__validate_steps(const mc_microbatch_calc *c) {
    int i;
    if (c->n_steps == 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.step_schedule must have at least one entry");
    if (c->step_threshold[0] != 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.step_schedule: first schedule entry must have "
                        "threshold 0, got %lld",
                        c->step_threshold[0]);
    for (i = 1; i < c->n_steps; i++)
        if (c->step_threshold[i] <= c->step_threshold[i - 1])
            return MC__FAIL(MC_ERR_INVALID_DESC,
                            "mc_microbatch_desc.step_schedule: schedule thresholds must be "
                            "strictly increasing, got %lld twice%s",
                            c->step_threshold[i],
                            c->desc.seq_length > 0 ? " (in samples, after dividing by seq_length)"
                                                   : "");
    for (i = 0; i < c->n_steps; i++)
        if (c->step_batch[i] <= 0)
            return MC__FAIL(MC_ERR_INVALID_DESC,
                            "mc_microbatch_desc.step_schedule: batch size must be positive, got "
                            "%d",
                            c->step_batch[i]);
    return MC_OK;
}

static int mc__microbatch_init_step(mc_microbatch_calc *c, const char *schedule) {
    const char *p = schedule;
    int rc;
    if (c->desc.decrease_batch_size_if_needed)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc: cannot combine step_schedule with "
                        "decrease_batch_size_if_needed (step batch size schedules do not support "
                        "decreasing the batch)");
    if (c->desc.global_batch_size != 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc: cannot specify both step_schedule and "
                        "global_batch_size (%d): the schedule's last entry is the global batch",
                        c->desc.global_batch_size);
    if (c->desc.seq_length < 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc.seq_length (%d) must be >= 0 (0: thresholds are "
                        "samples)",
                        c->desc.seq_length);
    for (;;) {
        size_t len;
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (*p == '\0') break;
        len = strcspn(p, " ,\t\n");
        if ((rc = mc__parse_step_entry(c, p, len)) != MC_OK) return rc;
        p += len;
    }
    mc__sort_steps(c);
    if ((rc = mc__validate_steps(c)) != MC_OK) return rc;
    c->mode = MC_MICROBATCH_STEP;
    c->global_batch_size = c->step_batch[c->n_steps - 1];
    return mc_microbatch_update(c, 0, 0);
}

MC_API int mc_microbatch_init(mc_microbatch_calc *calc, const mc_microbatch_desc *desc) {
    mc_microbatch_calc c;
    const mc_rampup *r;
    int has_rampup, rc;
    if (!calc || !desc)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_microbatch_init: calc (%p) and desc (%p) must be set",
                        (void *)calc, (const void *)desc);
    memset(&c, 0, sizeof c);
    c.desc = *desc;
    c.desc.step_schedule = NULL;
    r = &desc->rampup;
    has_rampup = r->start != 0 || r->increment != 0 || r->samples != 0;
    if ((rc = mc__microbatch_check_sizes(desc)) != MC_OK) return rc;
    if (has_rampup && desc->step_schedule)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_microbatch_desc: rampup and step_schedule exclude each other (the step "
                        "schedule replaced the ramp-up in Megatron)");
    if (desc->step_schedule) {
        rc = mc__microbatch_init_step(&c, desc->step_schedule);
    } else {
        if (desc->global_batch_size <= 0)
            return MC__FAIL(MC_ERR_INVALID_DESC,
                            "mc_microbatch_desc.global_batch_size (%d): global batch size should "
                            "be positive",
                            desc->global_batch_size);
        rc = has_rampup ? mc__microbatch_init_rampup(&c) : mc__microbatch_init_constant(&c);
    }
    if (rc == MC_OK) *calc = c;
    return rc;
}

/* The batch a ramp-up gives after `consumed` samples. */
static int mc__rampup_batch(const mc_microbatch_calc *c, long long consumed) {
    const mc_rampup *r = &c->desc.rampup;
    long long steps;
    if (consumed > r->samples || c->rampup_samples_per_increment == 0.0)
        return c->global_batch_size;
    steps = (long long)((double)consumed / c->rampup_samples_per_increment);
    MC_ASSERT(r->start + steps * r->increment <= c->global_batch_size);
    return (int)(r->start + steps * r->increment);
}

static int mc__step_batch(const mc_microbatch_calc *c, long long consumed) {
    int i, batch = c->step_batch[0];
    for (i = 0; i < c->n_steps && c->step_threshold[i] <= consumed; i++) batch = c->step_batch[i];
    return batch;
}

MC_API int mc_microbatch_update(mc_microbatch_calc *calc, long long consumed_samples,
                                int consistency_check) {
    if (!calc || calc->mode == MC_MICROBATCH_UNSET)
        return MC__FAIL(MC_ERR_STATE, "mc_microbatch_update: the calculator is not initialized "
                                      "(call mc_microbatch_init first)");
    switch (calc->mode) {
        case MC_MICROBATCH_RAMPUP:
            return mc__microbatch_apply(calc, mc__rampup_batch(calc, consumed_samples),
                                        consistency_check);
        case MC_MICROBATCH_STEP:
            return mc__microbatch_apply(calc, mc__step_batch(calc, consumed_samples),
                                        consistency_check);
        default:
            return MC_OK;   /* constant: Megatron's update is a no-op */
    }
}

/* Appends `consumed` when the batch there differs from the last point's. */
static int mc__change_point(const mc_microbatch_calc *c, long long consumed, int *last_batch,
                            long long *out, int cap, int n) {
    int batch = mc__rampup_batch(c, consumed);
    if (n > 0 && batch == *last_batch) return n;
    if (out && n < cap) out[n] = consumed;
    *last_batch = batch;
    return n + 1;
}

/* The first count in [lo, hi] whose ramp-up step is >= k (the step only grows with it). */
static long long mc__rampup_first_reaching(const mc_microbatch_calc *c, long long k, long long lo,
                                           long long hi) {
    while (lo < hi) {
        long long mid = lo + (hi - lo) / 2;
        if ((long long)((double)mid / c->rampup_samples_per_increment) >= k)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

MC_API int mc_microbatch_change_points(const mc_microbatch_calc *calc, long long *out, int cap) {
    int i, n = 0, last_batch = 0;
    long long n_inc, k, from = 0;
    if (!calc || calc->mode == MC_MICROBATCH_UNSET)
        return MC__FAIL(MC_ERR_STATE, "mc_microbatch_change_points: the calculator is not "
                                      "initialized");
    if (cap < 0) cap = 0;
    if (calc->mode == MC_MICROBATCH_STEP) {
        for (i = 0; i < calc->n_steps; i++)
            if (out && i < cap) out[i] = calc->step_threshold[i];
        return calc->n_steps;
    }
    if (calc->mode == MC_MICROBATCH_CONSTANT || calc->rampup_samples_per_increment == 0.0) {
        if (out && cap > 0) out[0] = 0;
        return 1;
    }
    n = mc__change_point(calc, 0, &last_batch, out, cap, n);
    n_inc = (calc->global_batch_size - calc->desc.rampup.start) / calc->desc.rampup.increment;
    for (k = 1; k <= n_inc; k++) {
        /* Rounding can leave the last step unreached within `samples`. */
        from = mc__rampup_first_reaching(calc, k, from, calc->desc.rampup.samples + 1);
        if (from > calc->desc.rampup.samples) break;
        n = mc__change_point(calc, from, &last_batch, out, cap, n);
    }
    return mc__change_point(calc, calc->desc.rampup.samples + 1, &last_batch, out, cap, n);
}

/* @params:implementation begin */

// ---------------------------------------------------------------------------------------------
// >>core.params
//
// The layout mirrors Megatron's _ParamAndGradBuffer, with every model chunk laid out after
// the previous one in one flat buffer (Megatron keeps one buffer per chunk; offsets inside a
// chunk are the same because each chunk starts on a padded bucket boundary).

#define MC__PARAM_START_ALIGN 64   /* §11.3: 128-byte aligned param starts (64 values) */
#define MC__PARAM_BUCKET_ALIGN 128 /* §11.3: bucket ends at a multiple of lcm(DP, 128) */

static size_t mc__param_gcd(size_t a, size_t b) {
    while (b != 0) {
        size_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

static size_t mc__param_round_up(size_t value, size_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
}

/* Drops a previous layout: adding a parameter changes every offset after it. */
static void mc__param_layout_clear(mc_param_table *t) {
    int i;
    mc_free(t->order);
    mc_free(t->buckets);
    t->order = NULL;
    t->buckets = NULL;
    t->n_buckets = 0;
    t->total = 0;
    for (i = 0; i < t->count; i++) t->info[i].offset = 0;
}

static int mc__param_check_proto(const char *name, const mc_param_info *p) {
    int d;
    if (p->ndim != 1 && p->ndim != 2)
        return MC__FAIL(MC_ERR_INVALID_ARG, "param %s: ndim (%d) must be 1 or 2", name, p->ndim);
    for (d = 0; d < p->ndim; d++) {
        if (p->global_shape[d] <= 0 || p->local_shape[d] <= 0)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "param %s: global_shape[%d] (%d) and local_shape[%d] (%d) must be > 0",
                            name, d, p->global_shape[d], d, p->local_shape[d]);
        if (d != p->partition_dim && p->local_shape[d] != p->global_shape[d])
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "param %s: local_shape[%d] (%d) differs from global_shape[%d] (%d) "
                            "but the tensor is not partitioned along dim %d (partition_dim %d)",
                            name, d, p->local_shape[d], d, p->global_shape[d], d,
                            p->partition_dim);
    }
    if (p->partition_dim < -1 || p->partition_dim >= p->ndim)
        return MC__FAIL(MC_ERR_INVALID_ARG, "param %s: partition_dim (%d) must be -1 or in [0, %d)",
                        name, p->partition_dim, p->ndim);
    if ((p->partition_dim >= 0) != (p->tensor_model_parallel != 0))
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "param %s: tensor_model_parallel (%d) must be set exactly when "
                        "partition_dim (%d) >= 0 (Megatron sets both together)",
                        name, p->tensor_model_parallel, p->partition_dim);
    if (p->partition_stride < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "param %s: partition_stride (%d) must be >= 0 "
                        "(0 means 1)", name, p->partition_stride);
    if (p->chunk < 0 || p->chunk >= MC_MAX_VPP)
        return MC__FAIL(MC_ERR_INVALID_ARG, "param %s: chunk (%d) must be in [0, MC_MAX_VPP = %d)",
                        name, p->chunk, MC_MAX_VPP);
    if (p->shared && !p->shared_embedding)
        return MC__FAIL(MC_ERR_INVALID_ARG, "param %s: shared (1) is the tied embedding copy and "
                        "needs shared_embedding = 1", name);
    return MC_OK;
}

static int mc__param_grow(mc_param_table *t) {
    int cap = t->capacity > 0 ? 2 * t->capacity : 16;
    mc_param_info *info = (mc_param_info *)mc_calloc((size_t)cap, sizeof *info);
    if (!info) return MC__FAIL(MC_ERR_NO_MEMORY, "mc_param_table_add: out of memory (%d params)",
                               cap);
    if (t->count > 0) memcpy(info, t->info, (size_t)t->count * sizeof *info);
    mc_free(t->info);
    t->info = info;
    t->capacity = cap;
    return MC_OK;
}

MC_API int mc_param_table_add(mc_param_table *t, const char *name, const mc_param_info *proto) {
    mc_param_info *p;
    size_t len;
    int rc;
    if (!t || !name || !proto)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_param_table_add: table, name and proto must be set");
    len = strlen(name);
    if (len == 0 || len >= MC_PARAM_NAME_MAX)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_param_table_add: name \"%.40s\" has %zu characters, must be 1 .. %d",
                        name, len, MC_PARAM_NAME_MAX - 1);
    if ((rc = mc__param_check_proto(name, proto)) != MC_OK) return rc;
    if (mc_param_table_find(t, name) >= 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_param_table_add: param %s is already registered "
                        "(names are unique keys)", name);
    if (t->count == t->capacity && (rc = mc__param_grow(t)) != MC_OK) return rc;
    mc__param_layout_clear(t);
    p = &t->info[t->count];
    *p = *proto;
    memcpy(p->name, name, len + 1);
    if (p->ndim == 1) {   /* keep the unused second dimension tidy: 1-D tensors are [n] */
        p->global_shape[1] = 1;
        p->local_shape[1] = 1;
    }
    p->partition_stride = MC__DEF(p->partition_stride, 1);
    p->offset = 0;
    p->numel = (size_t)p->local_shape[0] * (size_t)p->local_shape[1];
    return t->count++;
}

MC_API int mc_param_table_find(const mc_param_table *t, const char *name) {
    int i;
    if (!t || !name) return -1;
    for (i = 0; i < t->count; i++)
        if (strcmp(t->info[i].name, name) == 0) return i;
    return -1;
}

MC_API void mc_param_table_destroy(mc_param_table *t) {
    if (!t) return;
    mc__param_layout_clear(t);
    mc_free(t->info);
    memset(t, 0, sizeof *t);
}

/* The running state of one chunk's layout pass (Megatron's param_start_index etc.). */
typedef struct mc__param_layouter {
    mc_param_table *t;
    size_t bucket_align;    /* lcm(DP, 128) under the distributed optimizer, else 1 */
    size_t param_align;     /* 64 under the distributed optimizer, else 1 */
    size_t bucket_start;
    int bucket_first;       /* index into t->order of the open bucket's first param */
    int n_placed;           /* params placed so far (all chunks) */
    int chunk;
} mc__param_layouter;

/* Closes the open bucket at `param_end` (padded to the bucket alignment) and returns its end,
   where the next bucket starts. */
static size_t mc__param_close_bucket(mc__param_layouter *L, size_t param_end) {
    mc_bucket *b = &L->t->buckets[L->t->n_buckets++];
    int k;
    b->start = L->bucket_start;
    b->end = mc__param_round_up(param_end, L->bucket_align);
    b->first_param = L->bucket_first;
    b->n_params = L->n_placed - L->bucket_first;
    b->chunk = L->chunk;
    b->shared_embedding = 0;
    for (k = 0; k < b->n_params; k++)
        if (L->t->info[L->t->order[b->first_param + k]].shared_embedding) b->shared_embedding = 1;
    L->bucket_start = b->end;
    L->bucket_first = L->n_placed;
    return b->end;
}

/* Lays out the params of `chunk` in reverse registration order, from L->bucket_start.
   bucket_size 0: no size limit (one bucket, unless the shared embedding splits it). */
static void mc__param_layout_chunk(mc__param_layouter *L, int chunk, size_t bucket_size,
                                   int distributed_optimizer) {
    mc_param_table *t = L->t;
    size_t start = L->bucket_start, end = L->bucket_start;
    int i;
    L->chunk = chunk;
    L->bucket_first = L->n_placed;
    for (i = t->count - 1; i >= 0; i--) {
        mc_param_info *p = &t->info[i];
        /* Under the distributed optimizer the shared embedding gets a bucket of its own, so
           that the first and the last stage shard it identically (see mc_finalize_model_grads). */
        int own_bucket = distributed_optimizer && p->shared_embedding;
        if (p->chunk != chunk) continue;
        start = mc__param_round_up(start, L->param_align);
        if (own_bucket && L->n_placed > L->bucket_first) start = mc__param_close_bucket(L, start);
        p->offset = start;
        end = start + p->numel;
        t->order[L->n_placed++] = i;
        if ((bucket_size > 0 && end - L->bucket_start >= bucket_size) || own_bucket)
            start = mc__param_close_bucket(L, end);
        else
            start = end;
    }
    if (L->n_placed > L->bucket_first) mc__param_close_bucket(L, end);
}

MC_API int mc_param_table_layout(mc_param_table *t, const mc_param_layout_desc *desc) {
    mc_param_layout_desc d;
    mc__param_layouter L;
    int chunk, b;
    if (!t || !desc) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_param_table_layout: table and desc "
                                     "must be set");
    d = *desc;
    d.dp_size = MC__DEF(d.dp_size, 1);
    if (d.dp_size < 1)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_param_layout_desc.dp_size (%d) must be >= 1",
                        d.dp_size);
    if (d.pp_rank < 0)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_param_layout_desc.pp_rank (%d) must be >= 0",
                        d.pp_rank);
    mc__param_layout_clear(t);
    t->order = (int *)mc_calloc((size_t)(t->count > 0 ? t->count : 1), sizeof *t->order);
    t->buckets = (mc_bucket *)mc_calloc((size_t)(t->count > 0 ? t->count : 1),
                                        sizeof *t->buckets);   /* a bucket holds >= 1 param */
    if (!t->order || !t->buckets) {
        mc__param_layout_clear(t);
        return MC__FAIL(MC_ERR_NO_MEMORY, "mc_param_table_layout: out of memory (%d params)",
                        t->count);
    }
    memset(&L, 0, sizeof L);
    L.t = t;
    L.param_align = d.distributed_optimizer ? MC__PARAM_START_ALIGN : 1;
    L.bucket_align = d.distributed_optimizer
                         ? (size_t)d.dp_size / mc__param_gcd((size_t)d.dp_size,
                                                             MC__PARAM_BUCKET_ALIGN) *
                               MC__PARAM_BUCKET_ALIGN
                         : 1;
    for (chunk = 0; chunk < MC_MAX_VPP; chunk++) {
        /* Megatron builds buckets only for the first chunk of the first stage; the others
           get one bucket each (bucket_size None on pp_rank > 0 and disable_bucketing on
           chunks after the first). */
        size_t size = (d.pp_rank > 0 || chunk > 0) ? 0 : d.bucket_size;
        mc__param_layout_chunk(&L, chunk, size, d.distributed_optimizer);
    }
    t->total = L.bucket_start;
    t->layout = d;
    for (b = 0; b < t->n_buckets; b++)   /* Megatron asserts it: equal reduce-scatter shards */
        MC_ASSERT(!d.distributed_optimizer ||
                  (t->buckets[b].end - t->buckets[b].start) % (size_t)d.dp_size == 0);
    return MC_OK;
}

/* @params:implementation end */

/* =============================================================================================
   parallel_state (implementation) */

// ---------------------------------------------------------------------------------------------
// >>parallel_state.rank_grid
//
// Megatron's RankGenerator. The order string lists axes fastest first, so a rank is a
// mixed-radix number: rank = sum(coord[i] * stride[i]), stride[0] = 1,
// stride[i+1] = stride[i] * size[i]. A group kind is a mask over the axes: its groups vary the
// masked axes and fix the others. Groups are numbered by their unmasked coordinates (leftmost
// axis fastest) and members by their masked coordinates (leftmost axis fastest).

enum { MC__AX_TP = 0, MC__AX_CP, MC__AX_EP, MC__AX_DP, MC__AX_PP, MC__N_AXES };
static const char *const mc__axis_name[MC__N_AXES] = {"tp", "cp", "ep", "dp", "pp"};
/* Megatron appends missing size-1 axes in the order of its name_to_size dict. */
static const int mc__append_order[MC__N_AXES] = {MC__AX_TP, MC__AX_PP, MC__AX_DP, MC__AX_EP,
                                                 MC__AX_CP};
#define MC__BIT(axis) (1u << (axis))

typedef struct mc__kind_info {
    const char *name;
    int expert;       /* 1: groups come from the expert grid (etp, ep, edp, pp) */
    unsigned axes;    /* mask of the axes a group varies */
} mc__kind_info;

/* Indexed by mc_group_kind. Embedding kinds are derived from the pp groups. */
static const mc__kind_info mc__kinds[MC_GROUP_COUNT] = {
    {"tp", 0, MC__BIT(MC__AX_TP)},
    {"pp", 0, MC__BIT(MC__AX_PP)},
    {"dp", 0, MC__BIT(MC__AX_DP)},
    {"dp_cp", 0, MC__BIT(MC__AX_DP) | MC__BIT(MC__AX_CP)},
    {"cp", 0, MC__BIT(MC__AX_CP)},
    {"mp", 0, MC__BIT(MC__AX_TP) | MC__BIT(MC__AX_PP)},
    {"tp_dp", 0, MC__BIT(MC__AX_TP) | MC__BIT(MC__AX_DP)},
    {"tp_dp_cp", 0, MC__BIT(MC__AX_TP) | MC__BIT(MC__AX_DP) | MC__BIT(MC__AX_CP)},
    {"tp_cp", 0, MC__BIT(MC__AX_TP) | MC__BIT(MC__AX_CP)},
    {"embedding", 0, MC__BIT(MC__AX_PP)},
    {"position_embedding", 0, MC__BIT(MC__AX_PP)},
    {"ep", 1, MC__BIT(MC__AX_EP)},
    {"expert_tp", 1, MC__BIT(MC__AX_TP)},
    {"tp_ep", 1, MC__BIT(MC__AX_TP) | MC__BIT(MC__AX_EP)},
    {"tp_ep_pp", 1, MC__BIT(MC__AX_TP) | MC__BIT(MC__AX_EP) | MC__BIT(MC__AX_PP)},
    {"expert_dp", 1, MC__BIT(MC__AX_DP)},
};

static int mc__kind_valid(int kind) { return kind >= 0 && kind < MC_GROUP_COUNT; }
static int mc__kind_is_embedding(int kind) {
    return kind == MC_GROUP_EMBEDDING || kind == MC_GROUP_POSITION_EMBEDDING;
}

MC_API const char *mc_group_kind_name(mc_group_kind kind) {
    return mc__kind_valid((int)kind) ? mc__kinds[kind].name : "unknown";
}

/* Accepts "dp_cp" and "dp-cp" alike. */
MC_API int mc_group_kind_from_name(const char *name) {
    int k;
    size_t i, n;
    if (!name) return -1;
    n = strlen(name);
    for (k = 0; k < MC_GROUP_COUNT; k++) {
        const char *want = mc__kinds[k].name;
        if (strlen(want) != n) continue;
        for (i = 0; i < n; i++) {
            char c = name[i] == '-' ? '_' : name[i];
            if (c != want[i]) break;
        }
        if (i == n) return k;
    }
    return -1;
}

/* Sizes and strides of one grid (dense or expert), in order positions. */
typedef struct mc__radix {
    int n;
    int axis[MC__N_AXES];
    int size[MC__N_AXES];
    int stride[MC__N_AXES];
} mc__radix;

static void mc__radix_of(const mc_grid *g, int expert, mc__radix *r) {
    int i, stride = 1;
    r->n = g->n_axes;
    for (i = 0; i < g->n_axes; i++) {
        r->axis[i] = g->axis_id[i];
        r->size[i] = expert ? g->expert_size[i] : g->dense_size[i];
        r->stride[i] = stride;
        stride *= r->size[i];
    }
}

static int mc__radix_group_size(const mc__radix *r, unsigned mask) {
    int i, n = 1;
    for (i = 0; i < r->n; i++)
        if (mask & MC__BIT(r->axis[i])) n *= r->size[i];
    return n;
}

/* Members of group `index` of the groups varying the axes in `mask` (ascending). */
static int mc__radix_members(const mc__radix *r, unsigned mask, int index, int *out) {
    int i, j, base = 0, rest = index, n = mc__radix_group_size(r, mask);
    for (i = 0; i < r->n; i++) {
        if (mask & MC__BIT(r->axis[i])) continue;
        base += (rest % r->size[i]) * r->stride[i];
        rest /= r->size[i];
    }
    for (j = 0; j < n; j++) {
        int rank = base, q = j;
        for (i = 0; i < r->n; i++) {
            if (!(mask & MC__BIT(r->axis[i]))) continue;
            rank += (q % r->size[i]) * r->stride[i];
            q /= r->size[i];
        }
        out[j] = rank;
    }
    return n;
}

/* The group (index) holding `rank` and the rank's position in it. */
static void mc__radix_locate(const mc__radix *r, unsigned mask, int rank, int *group,
                             int *position) {
    int i, g = 0, g_scale = 1, p = 0, p_scale = 1;
    for (i = 0; i < r->n; i++) {
        int coord = (rank / r->stride[i]) % r->size[i];
        if (mask & MC__BIT(r->axis[i])) {
            p += coord * p_scale;
            p_scale *= r->size[i];
        } else {
            g += coord * g_scale;
            g_scale *= r->size[i];
        }
    }
    *group = g;
    *position = p;
}

static int mc__radix_coord(const mc__radix *r, int axis, int rank) {
    int i;
    for (i = 0; i < r->n; i++)
        if (r->axis[i] == axis) return (rank / r->stride[i]) % r->size[i];
    return 0;
}

static int mc__axis_from_token(const char *token, size_t len) {
    int a;
    for (a = 0; a < MC__N_AXES; a++)
        if (len == 2 && strncmp(token, mc__axis_name[a], 2) == 0) return a;
    return -1;
}

static int mc__grid_check_size(const char *field, int value) {
    if (value < 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_grid_desc.%s (%d) must be >= 1 (0 selects the default)", field, value);
    return MC_OK;
}

static int mc__grid_resolve_sizes(mc_grid *g, const mc_grid_desc *d) {
    long long dense, expert;
    int rc;
    if (d->world < 1)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_grid_desc.world (%d) must be >= 1", d->world);
    if (d->world > MC_MAX_RANKS)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_grid_desc.world (%d) exceeds MC_MAX_RANKS (%d)",
                        d->world, MC_MAX_RANKS);
    if ((rc = mc__grid_check_size("tp", d->tp)) != MC_OK) return rc;
    if ((rc = mc__grid_check_size("pp", d->pp)) != MC_OK) return rc;
    if ((rc = mc__grid_check_size("cp", d->cp)) != MC_OK) return rc;
    if ((rc = mc__grid_check_size("ep", d->ep)) != MC_OK) return rc;
    if ((rc = mc__grid_check_size("etp", d->etp)) != MC_OK) return rc;
    if (d->vpp < 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_grid_desc.vpp (%d) must be >= 0 (0 means no interleaving)", d->vpp);

    g->desc = *d;
    g->desc.tp = MC__DEF(d->tp, 1);
    g->desc.pp = MC__DEF(d->pp, 1);
    g->desc.cp = MC__DEF(d->cp, 1);
    g->desc.ep = MC__DEF(d->ep, 1);
    g->desc.etp = MC__DEF(d->etp, g->desc.tp);
    g->desc.order = d->order ? d->order : MC__DEFAULT_ORDER;

    /* Megatron: DP = world / (TP * PP * CP); DP excludes CP (RuntimeError otherwise). */
    dense = (long long)g->desc.tp * g->desc.pp * g->desc.cp;
    if (dense > d->world || d->world % dense != 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "world_size (%d) is not divisible by tensor_model_parallel_size (%d) x "
                        "pipeline_model_parallel_size (%d) x context_parallel_size (%d) = %lld",
                        d->world, g->desc.tp, g->desc.pp, g->desc.cp, dense);
    if (g->desc.vpp > 0 && g->desc.pp <= 1)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "pipeline-model-parallel size should be greater than 1 with interleaved "
                        "schedule (mc_grid_desc.vpp = %d, pp = %d)",
                        g->desc.vpp, g->desc.pp);
    /* The expert view factors the same world: world = ETP * EP * EDP * PP. */
    expert = (long long)g->desc.etp * g->desc.ep * g->desc.pp;
    if (expert > d->world || d->world % expert != 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "world_size (%d) is not divisible by expert_tensor_model_pipeline_parallel "
                        "size (ETP x EP x PP = %d x %d x %d = %lld)",
                        d->world, g->desc.etp, g->desc.ep, g->desc.pp, expert);
    g->dp = (int)(d->world / dense);
    g->edp = (int)(d->world / expert);
    return MC_OK;
}

/* Splits the order string into axes; rejects unknown, empty and repeated tokens. */
static int mc__grid_parse_order(mc_grid *g, const char *order, int *seen) {
    const char *p = order;
    int a;
    for (a = 0; a < MC__N_AXES; a++) seen[a] = 0;
    g->n_axes = 0;
    if (strlen(order) >= MC_ORDER_MAX)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_grid_desc.order \"%s\" is longer than %d characters", order,
                        MC_ORDER_MAX - 1);
    for (;;) {
        const char *dash = strchr(p, '-');
        size_t len = dash ? (size_t)(dash - p) : strlen(p);
        int axis = mc__axis_from_token(p, len);
        if (len == 0)
            return MC__FAIL(MC_ERR_INVALID_DESC,
                            "mc_grid_desc.order \"%s\" has an empty token (tokens are tp, cp, ep, "
                            "dp, pp separated by '-')",
                            order);
        if (axis < 0)
            return MC__FAIL(MC_ERR_INVALID_DESC,
                            "mc_grid_desc.order \"%s\": unknown token \"%.*s\" (allowed: tp, cp, "
                            "ep, dp, pp)",
                            order, (int)len, p);
        if (seen[axis])
            return MC__FAIL(MC_ERR_INVALID_DESC,
                            "mc_grid_desc.order \"%s\": token \"%s\" appears twice", order,
                            mc__axis_name[axis]);
        seen[axis] = 1;
        g->axis_id[g->n_axes++] = axis;
        if (!dash) break;
        p = dash + 1;
    }
    return MC_OK;
}

static void mc__grid_axis_sizes(const mc_grid *g, int expert, int *size) {
    size[MC__AX_TP] = expert ? g->desc.etp : g->desc.tp;
    size[MC__AX_CP] = expert ? 1 : g->desc.cp;
    size[MC__AX_EP] = expert ? g->desc.ep : 1;
    size[MC__AX_DP] = expert ? g->edp : g->dp;
    size[MC__AX_PP] = g->desc.pp;
}

/* A missing axis is fine at size 1 (appended) and an error otherwise, per generator. */
static int mc__grid_check_missing(const mc_grid *g, const int *seen, const char *order) {
    int expert, i;
    for (expert = 0; expert < 2; expert++) {
        int size[MC__N_AXES];
        mc__grid_axis_sizes(g, expert, size);
        for (i = 0; i < MC__N_AXES; i++) {
            int a = mc__append_order[i];
            if (!seen[a] && size[a] != 1)
                return MC__FAIL(MC_ERR_INVALID_DESC,
                                "The size of (%s) is (%d), but you haven't specified the order "
                                "(%s): mc_grid_desc.order must list every axis of size > 1 in "
                                "the %s grid",
                                mc__axis_name[a], size[a], order, expert ? "expert" : "dense");
        }
    }
    return MC_OK;
}

static void mc__grid_finish_order(mc_grid *g, int *seen) {
    int i, dense[MC__N_AXES], expert[MC__N_AXES];
    for (i = 0; i < MC__N_AXES; i++) {
        int a = mc__append_order[i];
        if (!seen[a]) {
            seen[a] = 1;
            g->axis_id[g->n_axes++] = a;
        }
    }
    mc__grid_axis_sizes(g, 0, dense);
    mc__grid_axis_sizes(g, 1, expert);
    g->order[0] = '\0';
    for (i = 0; i < g->n_axes; i++) {
        if (i) strcat(g->order, "-");
        strcat(g->order, mc__axis_name[g->axis_id[i]]);
        g->dense_size[i] = dense[g->axis_id[i]];
        g->expert_size[i] = expert[g->axis_id[i]];
    }
}

#define MC__LIST_SHOWN 16

/* "[0,4,8]"; a list of n_total ranks of which only the first n_known are at hand (or more
   than MC__LIST_SHOWN) ends with ",...+k]". */
static void mc__format_ranks(char *buf, size_t cap, const int *ranks, int n_known, int n_total) {
    size_t used = 0;
    int i, shown = n_known < MC__LIST_SHOWN ? n_known : MC__LIST_SHOWN;
    buf[0] = '\0';
    used += (size_t)snprintf(buf + used, cap - used, "[");
    for (i = 0; i < shown && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, i ? ",%d" : "%d", ranks[i]);
    if (used < cap && shown < n_total)
        used += (size_t)snprintf(buf + used, cap - used, ",...+%d", n_total - shown);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* Megatron's two assertions that tie the dense and the expert grid together. */
static int mc__grid_check_grids_agree(const mc_grid *g, const char *order) {
    size_t len = strlen(order);
    int ends_with_pp = len >= 2 && strcmp(order + len - 2, "pp") == 0;
    mc__radix dense, expert;
    int *a, *b, n_groups, gi, n, i, rc = MC_OK;
    if (!ends_with_pp && g->desc.pp != 1 && g->edp != g->dp)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "When not using pp-last rank ordering, the data parallel size of the "
                        "attention and moe layers must be the same: mc_grid_desc.order \"%s\" does "
                        "not end with pp, pp = %d, and the expert data-parallel size %d (world / "
                        "(etp x ep x pp)) differs from the data-parallel size %d (Megatron asserts "
                        "order.endswith(\"pp\") or PP == 1 or EDP == DP)",
                        order, g->desc.pp, g->edp, g->dp);
    mc__radix_of(g, 0, &dense);
    mc__radix_of(g, 1, &expert);
    n = g->desc.pp;
    a = (int *)mc_malloc(sizeof(int) * (size_t)n * 2);
    if (!a) return MC__FAIL(MC_ERR_NO_MEMORY, "mc_grid_init: out of memory");
    b = a + n;
    n_groups = g->desc.world / n;
    for (gi = 0; gi < n_groups && rc == MC_OK; gi++) {
        mc__radix_members(&dense, MC__BIT(MC__AX_PP), gi, a);
        mc__radix_members(&expert, MC__BIT(MC__AX_PP), gi, b);
        for (i = 0; i < n; i++)
            if (a[i] != b[i]) break;
        if (i < n) {
            char la[160], lb[160];
            mc__format_ranks(la, sizeof la, a, n, n);
            mc__format_ranks(lb, sizeof lb, b, n, n);
            rc = MC__FAIL(MC_ERR_INVALID_DESC,
                          "Pipeline parallel groups are expected to be the same for the dense and "
                          "the expert grid, but pp group %d is %s in the dense grid and %s in the "
                          "expert grid (order \"%s\", tp = %d, cp = %d, etp = %d, ep = %d)",
                          gi, la, lb, g->order, g->desc.tp, g->desc.cp, g->desc.etp, g->desc.ep);
        }
    }
    mc_free(a);
    return rc;
}

MC_API int mc_grid_init(mc_grid *grid, const mc_grid_desc *desc) {
    mc_grid g;
    int seen[MC__N_AXES], rc;
    if (!grid || !desc)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_grid_init: grid (%p) and desc (%p) must be set",
                        (void *)grid, (const void *)desc);
    memset(&g, 0, sizeof g);
    if ((rc = mc__grid_resolve_sizes(&g, desc)) != MC_OK) return rc;
    if ((rc = mc__grid_parse_order(&g, g.desc.order, seen)) != MC_OK) return rc;
    if ((rc = mc__grid_check_missing(&g, seen, g.desc.order)) != MC_OK) return rc;
    mc__grid_finish_order(&g, seen);
    if ((rc = mc__grid_check_grids_agree(&g, g.desc.order)) != MC_OK) return rc;
    *grid = g;
    return MC_OK;
}

static int mc__grid_check(const mc_grid *g, const char *fn) {
    if (!g || g->n_axes != MC__N_AXES)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: grid is NULL or not initialised by mc_grid_init",
                        fn);
    return MC_OK;
}

static int mc__grid_check_rank(const mc_grid *g, int rank, const char *fn) {
    if (rank < 0 || rank >= g->desc.world)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: rank (%d) must be in [0, world = %d)", fn, rank,
                        g->desc.world);
    return MC_OK;
}

static int mc__grid_check_kind(int kind, const char *fn) {
    if (!mc__kind_valid(kind))
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: kind (%d) must be in [0, MC_GROUP_COUNT = %d)",
                        fn, kind, MC_GROUP_COUNT);
    return MC_OK;
}

MC_API int mc_grid_coords(const mc_grid *grid, int rank, mc_rank_coords *out) {
    mc__radix dense, expert;
    int rc;
    if ((rc = mc__grid_check(grid, "mc_grid_coords")) != MC_OK) return rc;
    if ((rc = mc__grid_check_rank(grid, rank, "mc_grid_coords")) != MC_OK) return rc;
    if (!out) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_grid_coords: out must not be NULL");
    mc__radix_of(grid, 0, &dense);
    mc__radix_of(grid, 1, &expert);
    out->rank = rank;
    out->tp = mc__radix_coord(&dense, MC__AX_TP, rank);
    out->cp = mc__radix_coord(&dense, MC__AX_CP, rank);
    out->dp = mc__radix_coord(&dense, MC__AX_DP, rank);
    out->pp = mc__radix_coord(&dense, MC__AX_PP, rank);
    out->etp = mc__radix_coord(&expert, MC__AX_TP, rank);
    out->ep = mc__radix_coord(&expert, MC__AX_EP, rank);
    out->edp = mc__radix_coord(&expert, MC__AX_DP, rank);
    return MC_OK;
}

MC_API int mc_grid_group_size(const mc_grid *grid, mc_group_kind kind) {
    mc__radix r;
    int rc;
    if ((rc = mc__grid_check(grid, "mc_grid_group_size")) != MC_OK) return rc;
    if ((rc = mc__grid_check_kind((int)kind, "mc_grid_group_size")) != MC_OK) return rc;
    if (kind == MC_GROUP_EMBEDDING) return grid->desc.pp > 1 ? 2 : 1;
    if (kind == MC_GROUP_POSITION_EMBEDDING) return 1;
    mc__radix_of(grid, mc__kinds[kind].expert, &r);
    return mc__radix_group_size(&r, mc__kinds[kind].axes);
}

MC_API int mc_grid_num_groups(const mc_grid *grid, mc_group_kind kind) {
    mc__radix r;
    int rc;
    if ((rc = mc__grid_check(grid, "mc_grid_num_groups")) != MC_OK) return rc;
    if ((rc = mc__grid_check_kind((int)kind, "mc_grid_num_groups")) != MC_OK) return rc;
    mc__radix_of(grid, mc__kinds[kind].expert, &r);
    /* Embedding kinds: one group per pp group. */
    return grid->desc.world / mc__radix_group_size(&r, mc__kinds[kind].axes);
}

/* Members without argument checks; out must hold the group size. */
static int mc__grid_members(const mc_grid *g, int kind, int index, int *out) {
    mc__radix r;
    mc__radix_of(g, mc__kinds[kind].expert, &r);
    if (mc__kind_is_embedding(kind)) {
        int pp = g->desc.pp, first, last;
        int *pp_ranks = (int *)mc_malloc(sizeof(int) * (size_t)pp);
        if (!pp_ranks) return MC__FAIL(MC_ERR_NO_MEMORY, "out of memory");
        mc__radix_members(&r, MC__BIT(MC__AX_PP), index, pp_ranks);
        first = pp_ranks[0];
        last = pp_ranks[pp - 1];
        mc_free(pp_ranks);
        out[0] = first;
        if (kind == MC_GROUP_POSITION_EMBEDDING || pp == 1) return 1;
        out[1] = last;
        return 2;
    }
    return mc__radix_members(&r, mc__kinds[kind].axes, index, out);
}

MC_API int mc_grid_group_members(const mc_grid *grid, mc_group_kind kind, int index, int *out,
                                 int cap) {
    int rc, n, n_groups;
    if ((rc = mc__grid_check(grid, "mc_grid_group_members")) != MC_OK) return rc;
    if ((rc = mc__grid_check_kind((int)kind, "mc_grid_group_members")) != MC_OK) return rc;
    n = mc_grid_group_size(grid, kind);
    n_groups = mc_grid_num_groups(grid, kind);
    if (index < 0 || index >= n_groups)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_grid_group_members: index (%d) must be in [0, %d), the number of %s "
                        "groups",
                        index, n_groups, mc__kinds[kind].name);
    if (!out) return n;
    if (cap < n)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_grid_group_members: cap (%d) is smaller than the %s group size (%d)",
                        cap, mc__kinds[kind].name, n);
    return mc__grid_members(grid, (int)kind, index, out);
}

MC_API int mc_grid_group_of(const mc_grid *grid, mc_group_kind kind, int rank, int *group_index,
                            int *index_in_group) {
    mc__radix r;
    int rc, g = -1, p = -1;
    if (group_index) *group_index = -1;
    if (index_in_group) *index_in_group = -1;
    if ((rc = mc__grid_check(grid, "mc_grid_group_of")) != MC_OK) return rc;
    if ((rc = mc__grid_check_kind((int)kind, "mc_grid_group_of")) != MC_OK) return rc;
    if ((rc = mc__grid_check_rank(grid, rank, "mc_grid_group_of")) != MC_OK) return rc;
    mc__radix_of(grid, mc__kinds[kind].expert, &r);
    mc__radix_locate(&r, mc__kinds[kind].axes, rank, &g, &p);
    if (mc__kind_is_embedding((int)kind)) {
        /* p is the pipeline stage here: stage 0 is member 0; the last stage is member 1 of
           the embedding group (PP > 1); any other stage is in no group (not an error). */
        int is_last = p == grid->desc.pp - 1;
        if (p != 0 && !(is_last && kind == MC_GROUP_EMBEDDING)) return MC_ERR_NOT_MEMBER;
        p = p == 0 ? 0 : 1;
    }
    if (group_index) *group_index = g;
    if (index_in_group) *index_in_group = p;
    return MC_OK;
}

MC_API int mc_grid_pipeline_ranks(const mc_grid *grid, int rank, int *first, int *last, int *next,
                                  int *prev) {
    mc__radix r;
    int rc, g, p, pp, *ranks;
    if ((rc = mc__grid_check(grid, "mc_grid_pipeline_ranks")) != MC_OK) return rc;
    if ((rc = mc__grid_check_rank(grid, rank, "mc_grid_pipeline_ranks")) != MC_OK) return rc;
    pp = grid->desc.pp;
    ranks = (int *)mc_malloc(sizeof(int) * (size_t)pp);
    if (!ranks) return MC__FAIL(MC_ERR_NO_MEMORY, "mc_grid_pipeline_ranks: out of memory");
    mc__radix_of(grid, 0, &r);
    mc__radix_locate(&r, MC__BIT(MC__AX_PP), rank, &g, &p);
    mc__radix_members(&r, MC__BIT(MC__AX_PP), g, ranks);
    /* Cyclic, as in Megatron: the last stage's next is the first stage. */
    if (first) *first = ranks[0];
    if (last) *last = ranks[pp - 1];
    if (next) *next = ranks[(p + 1) % pp];
    if (prev) *prev = ranks[(p + pp - 1) % pp];
    mc_free(ranks);
    return MC_OK;
}

/* Kinds created before the per-pp-group triples, and after them (Megatron's HEAD order). */
static const mc_group_kind mc__plan_head[] = {MC_GROUP_DP_CP, MC_GROUP_DP, MC_GROUP_CP,
                                              MC_GROUP_MP, MC_GROUP_TP};
static const mc_group_kind mc__plan_tail[] = {
    MC_GROUP_TP_DP_CP, MC_GROUP_TP_DP,   MC_GROUP_TP_CP,    MC_GROUP_EP,
    MC_GROUP_EXPERT_TP, MC_GROUP_TP_EP, MC_GROUP_TP_EP_PP, MC_GROUP_EXPERT_DP};

static void mc__plan_push(mc_plan_entry *out, int cap, int *n, mc_group_kind kind, int index) {
    if (out && *n < cap) {
        out[*n].kind = kind;
        out[*n].index = index;
    }
    (*n)++;
}

static void mc__plan_push_kind(const mc_grid *g, mc_plan_entry *out, int cap, int *n,
                               mc_group_kind kind) {
    int i, groups = mc_grid_num_groups(g, kind);
    for (i = 0; i < groups; i++) mc__plan_push(out, cap, n, kind, i);
}

MC_API int mc_grid_creation_plan(const mc_grid *grid, mc_plan_entry *out, int cap) {
    int rc, n = 0, i, pp_groups;
    if ((rc = mc__grid_check(grid, "mc_grid_creation_plan")) != MC_OK) return rc;
    for (i = 0; i < MC__COUNTOF(mc__plan_head); i++)
        mc__plan_push_kind(grid, out, cap, &n, mc__plan_head[i]);
    /* Each pp group is followed by its embedding and position-embedding group. */
    pp_groups = mc_grid_num_groups(grid, MC_GROUP_PP);
    for (i = 0; i < pp_groups; i++) {
        mc__plan_push(out, cap, &n, MC_GROUP_PP, i);
        mc__plan_push(out, cap, &n, MC_GROUP_EMBEDDING, i);
        mc__plan_push(out, cap, &n, MC_GROUP_POSITION_EMBEDDING, i);
    }
    for (i = 0; i < MC__COUNTOF(mc__plan_tail); i++)
        mc__plan_push_kind(grid, out, cap, &n, mc__plan_tail[i]);
    return n;
}

static uint64_t mc__hash_ranks(uint64_t h, const int *ranks, int n) {
    int i;
    h = mc__fnv_int(h, (uint64_t)(int64_t)n);
    for (i = 0; i < n; i++) h = mc__fnv_int(h, (uint64_t)(int64_t)ranks[i]);
    return h;
}

static uint64_t mc__grid_sizes_hash(const mc_grid *g, uint64_t h) {
    const int sizes[9] = {g->desc.world, g->desc.tp, g->desc.pp, g->desc.vpp, g->desc.cp,
                          g->desc.ep,    g->desc.etp, g->dp,     g->edp};
    int i;
    for (i = 0; i < 9; i++) h = mc__fnv_int(h, (uint64_t)(int64_t)sizes[i]);
    return mc__fnv_bytes(h, g->order, strlen(g->order));
}

MC_API uint64_t mc_grid_plan_fingerprint(const mc_grid *grid, uint64_t salt) {
    uint64_t h = MC__FNV_OFFSET;
    mc_plan_entry *plan;
    int *members, n, i;
    if (mc__grid_check(grid, "mc_grid_plan_fingerprint") != MC_OK) return 0;
    h = mc__fnv_int(h, (uint64_t)MC_VERSION_HEX);
    h = mc__fnv_int(h, salt);
    h = mc__grid_sizes_hash(grid, h);
    n = mc_grid_creation_plan(grid, NULL, 0);
    plan = (mc_plan_entry *)mc_malloc(sizeof(mc_plan_entry) * (size_t)n);
    members = (int *)mc_malloc(sizeof(int) * (size_t)grid->desc.world);
    if (!plan || !members) {
        mc_free(plan);
        mc_free(members);
        MC__FAIL(MC_ERR_NO_MEMORY, "mc_grid_plan_fingerprint: out of memory");
        return 0;
    }
    mc_grid_creation_plan(grid, plan, n);
    for (i = 0; i < n; i++) {
        int m = mc__grid_members(grid, (int)plan[i].kind, plan[i].index, members);
        h = mc__fnv_int(h, (uint64_t)plan[i].kind);
        h = mc__hash_ranks(h, members, m);
    }
    mc_free(plan);
    mc_free(members);
    return h;
}

// ---------------------------------------------------------------------------------------------
// >>parallel_state.comm  (shared helpers; the public wrappers follow the backends)

/* One point-to-point operation as a batch of one: the backends run send and recv that way. */
static mc_p2p_op mc__p2p_one(int is_send, const void *buf, size_t count, mc_dtype dt, int peer,
                             int tag) {
    mc_p2p_op op;
    op.is_send = is_send;
    op.buf = (void *)(uintptr_t)buf;
    op.count = count;
    op.dtype = dt;
    op.peer = peer;
    op.tag = tag;
    return op;
}

MC_API size_t mc_dtype_size(mc_dtype dtype) {
    switch (dtype) {
        case MC_F32: return 4;
        case MC_F64: return 8;
        case MC_I32: return 4;
        case MC_I64: return 8;
        case MC_U8: return 1;
        case MC_BF16: return 2;
        default: return 0;
    }
}

MC_API const char *mc_backend_name(mc_comm_backend backend) {
    switch (backend) {
        case MC_BACKEND_AUTO: return "auto";
        case MC_BACKEND_SELF: return "self";
        case MC_BACKEND_MPI: return "mpi";
        case MC_BACKEND_NCCL: return "nccl";
        default: return "unknown";
    }
}

static mc_comm *mc__comm_new(const mc_comm_ops *ops, mc_comm_backend backend, int rank, int size,
                             double timeout_s, const char *name) {
    mc_comm *c = (mc_comm *)mc_calloc(1, sizeof(mc_comm));
    if (!c) return NULL;
    c->ops = ops;
    c->backend = backend;
    c->rank = rank;
    c->size = size;
    c->world_rank = rank;
    c->timeout_s = timeout_s;
    c->mem = mc_ops_cpu();   /* the world's desc or the parent may replace it */
    snprintf(c->name, sizeof c->name, "%s", name);
    return c;
}

/* The world's memory owner for the self and mpi backends (nccl sets its own): self copies
   through any table; mpi stages a device table's buffers through host copies
   (mc__mpi_staged). */
static int mc__comm_take_memory(mc_comm *c, const mc_ops *memory) {
    if (!memory) return MC_OK;   /* the CPU table, set at creation */
    if (!memory->upload || !memory->download || !memory->copy_2d || !memory->alloc)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_comm_desc.memory: the '%s' table needs alloc, upload, download and "
                        "copy_2d", memory->name ? memory->name : "?");
    c->mem = memory;
    return MC_OK;
}

/* Copies bytes between buffers of the communicator's memory (host or device). */
static int mc__comm_copy(mc_comm *c, void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return MC_OK;
    return c->mem->copy_2d(c->mem, dst, bytes, src, bytes, bytes, 1);
}

// ---------------------------------------------------------------------------------------------
// >>parallel_state.comm_self  Size 1: collectives are copies; send/recv to itself go through a FIFO queue.

typedef struct mc__self_request {
    mc_request_head head;
    int outstanding;     /* receives still waiting for a matching send */
} mc__self_request;

typedef struct mc__self_message {
    struct mc__self_message *next;
    int tag;
    size_t bytes;
    void *data;
} mc__self_message;

typedef struct mc__self_pending {
    struct mc__self_pending *next;
    int tag;
    size_t bytes;
    void *buf;
    mc__self_request *owner;
} mc__self_pending;

typedef struct mc__self_state {
    mc__self_message *messages;   /* sent, not yet received (FIFO) */
    mc__self_pending *pending;    /* posted receives without a message yet (FIFO) */
} mc__self_state;

static const mc_comm_ops *mc__self_ops(void);

static mc__self_request *mc__self_request_new(mc_comm *c, const char *op) {
    mc__self_request *q = (mc__self_request *)mc_calloc(1, sizeof(mc__self_request));
    if (!q) return NULL;
    q->head.comm = c;
    q->head.op = op;
    return q;
}

static void mc__self_drop_pending(mc__self_state *s, const mc__self_request *owner) {
    mc__self_pending **pp = &s->pending;
    while (*pp) {
        if ((*pp)->owner == owner) {
            mc__self_pending *dead = *pp;
            *pp = dead->next;
            mc_free(dead);
        } else {
            pp = &(*pp)->next;
        }
    }
}

static int mc__self_wait(mc_request *req, double timeout_s) {
    mc__self_request *q = (mc__self_request *)req;
    mc_comm *c = q->head.comm;
    const char *op = q->head.op;
    int outstanding = q->outstanding;
    (void)timeout_s;
    if (outstanding > 0) {
        /* Nothing else runs on a size-1 communicator: the receive can never complete. */
        mc__self_drop_pending((mc__self_state *)c->impl, q);
        mc_free(q);
        return MC__FAIL(MC_ERR_TIMEOUT,
                        "%s on communicator %s (size 1): %d receive(s) have no matching send, and "
                        "no other rank can send one",
                        op, c->name, outstanding);
    }
    mc_free(q);
    return MC_OK;
}

static int mc__self_test(mc_request *req, int *done) {
    mc__self_request *q = (mc__self_request *)req;
    *done = q->outstanding == 0;
    if (*done) mc_free(q);
    return MC_OK;
}

static int mc__self_complete(mc_comm *c, mc__self_request *q, mc_request **req) {
    if (req) {
        *req = (mc_request *)q;
        return MC_OK;
    }
    return mc__self_wait((mc_request *)q, c->timeout_s);
}

static int mc__self_start(mc_comm *c, const char *op, mc_request **req) {
    mc__self_request *q;
    if (!req) return MC_OK;   /* blocking and already done */
    q = mc__self_request_new(c, op);
    if (!q) return MC__FAIL(MC_ERR_NO_MEMORY, "%s on %s: out of memory", op, c->name);
    *req = (mc_request *)q;
    return MC_OK;
}

static int mc__self_all_reduce(mc_comm *c, const void *send, void *recv, size_t count,
                               mc_dtype dt, mc_reduce_op op, mc_request **req) {
    int rc;
    (void)op;   /* one rank: sum, max, min and average of one value are the value */
    if ((rc = mc__comm_copy(c, recv, send, count * mc_dtype_size(dt))) != MC_OK) return rc;
    return mc__self_start(c, "all_reduce", req);
}

static int mc__self_all_gather(mc_comm *c, const void *send, void *recv, size_t count,
                               mc_dtype dt, mc_request **req) {
    int rc;
    if ((rc = mc__comm_copy(c, recv, send, count * mc_dtype_size(dt))) != MC_OK) return rc;
    return mc__self_start(c, "all_gather", req);
}

static int mc__self_reduce_scatter(mc_comm *c, const void *send, void *recv, size_t recv_count,
                                   mc_dtype dt, mc_reduce_op op, mc_request **req) {
    int rc;
    (void)op;
    if ((rc = mc__comm_copy(c, recv, send, recv_count * mc_dtype_size(dt))) != MC_OK) return rc;
    return mc__self_start(c, "reduce_scatter", req);
}

static int mc__self_broadcast(mc_comm *c, void *buf, size_t count, mc_dtype dt, int root,
                              mc_request **req) {
    (void)buf;
    (void)count;
    (void)dt;
    (void)root;
    return mc__self_start(c, "broadcast", req);
}

static int mc__self_post_send(mc_comm *c, const void *buf, size_t bytes, int tag) {
    mc__self_state *s = (mc__self_state *)c->impl;
    mc__self_pending **pp = &s->pending;
    mc__self_message *m, **tail;
    for (; *pp; pp = &(*pp)->next) {
        mc__self_pending *p = *pp;
        if (p->tag != tag) continue;
        if (bytes > p->bytes)
            return MC__FAIL(MC_ERR_COMM,
                            "send to self on %s (tag %d): %zu bytes do not fit the posted "
                            "receive of %zu bytes",
                            c->name, tag, bytes, p->bytes);
        int rc = mc__comm_copy(c, p->buf, buf, bytes);
        if (rc != MC_OK) return rc;
        p->owner->outstanding--;
        *pp = p->next;
        mc_free(p);
        return MC_OK;
    }
    m = (mc__self_message *)mc_calloc(1, sizeof(mc__self_message));
    if (!m) return MC__FAIL(MC_ERR_NO_MEMORY, "send to self on %s: out of memory", c->name);
    /* the queued copy lives in the communicator's memory, like the buffers */
    if (mc_ops_alloc(c->mem, MC_MEMORY_COMMUNICATION, &m->data, bytes) != MC_OK ||
        mc__comm_copy(c, m->data, buf, bytes) != MC_OK) {
        if (m->data) mc_ops_free(c->mem, m->data);
        mc_free(m);
        return MC__FAIL(MC_ERR_NO_MEMORY, "send to self on %s: no memory for a %zu-byte message "
                        "(%s)", c->name, bytes, mc_last_error());
    }
    m->tag = tag;
    m->bytes = bytes;
    for (tail = &s->messages; *tail; tail = &(*tail)->next) {
    }
    *tail = m;
    return MC_OK;
}

static int mc__self_post_recv(mc_comm *c, void *buf, size_t bytes, int tag,
                              mc__self_request *owner) {
    mc__self_state *s = (mc__self_state *)c->impl;
    mc__self_message **mp = &s->messages;
    mc__self_pending *p, **tail;
    for (; *mp; mp = &(*mp)->next) {
        mc__self_message *m = *mp;
        if (m->tag != tag) continue;
        if (m->bytes > bytes)
            return MC__FAIL(MC_ERR_COMM,
                            "recv from self on %s (tag %d): the %zu-byte message does not fit "
                            "the %zu-byte buffer",
                            c->name, tag, m->bytes, bytes);
        int rc = mc__comm_copy(c, buf, m->data, m->bytes);
        *mp = m->next;
        mc_ops_free(c->mem, m->data);
        mc_free(m);
        return rc;
    }
    p = (mc__self_pending *)mc_calloc(1, sizeof(mc__self_pending));
    if (!p) return MC__FAIL(MC_ERR_NO_MEMORY, "recv from self on %s: out of memory", c->name);
    p->tag = tag;
    p->bytes = bytes;
    p->buf = buf;
    p->owner = owner;
    owner->outstanding++;
    for (tail = &s->pending; *tail; tail = &(*tail)->next) {
    }
    *tail = p;
    return MC_OK;
}

static int mc__self_batch(mc_comm *c, const mc_p2p_op *ops, int n_ops, mc_request **req) {
    mc__self_request *q = mc__self_request_new(c, n_ops == 1 ? (ops[0].is_send ? "send" : "recv")
                                                              : "batch_send_recv");
    int i, rc = MC_OK;
    if (!q) return MC__FAIL(MC_ERR_NO_MEMORY, "p2p on %s: out of memory", c->name);
    /* Receives first, so that a send in the same batch lands directly in its buffer. */
    for (i = 0; i < n_ops && rc == MC_OK; i++)
        if (!ops[i].is_send)
            rc = mc__self_post_recv(c, ops[i].buf, ops[i].count * mc_dtype_size(ops[i].dtype),
                                    ops[i].tag, q);
    for (i = 0; i < n_ops && rc == MC_OK; i++)
        if (ops[i].is_send)
            rc = mc__self_post_send(c, ops[i].buf, ops[i].count * mc_dtype_size(ops[i].dtype),
                                    ops[i].tag);
    if (rc != MC_OK) {
        mc__self_drop_pending((mc__self_state *)c->impl, q);
        mc_free(q);
        return rc;
    }
    return mc__self_complete(c, q, req);
}

static int mc__self_send(mc_comm *c, const void *buf, size_t count, mc_dtype dt, int peer,
                         int tag, mc_request **req) {
    mc_p2p_op op = mc__p2p_one(1, buf, count, dt, peer, tag);
    return mc__self_batch(c, &op, 1, req);
}

static int mc__self_recv(mc_comm *c, void *buf, size_t count, mc_dtype dt, int peer, int tag,
                         mc_request **req) {
    mc_p2p_op op = mc__p2p_one(0, buf, count, dt, peer, tag);
    return mc__self_batch(c, &op, 1, req);
}

static int mc__self_barrier(mc_comm *c, mc_request **req) {
    return mc__self_start(c, "barrier", req);
}

static mc_comm *mc__self_new_comm(double timeout_s, const char *name) {
    mc_comm *c = mc__comm_new(mc__self_ops(), MC_BACKEND_SELF, 0, 1, timeout_s, name);
    if (!c) return NULL;
    c->impl = mc_calloc(1, sizeof(mc__self_state));
    if (!c->impl) {
        mc_free(c);
        return NULL;
    }
    return c;
}

static int mc__self_create_child(mc_comm *c, const int *members, int n_members, int seq,
                                 mc_comm **out) {
    mc_comm *child;
    (void)seq;
    if (n_members != 1 || members[0] != 0)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "create_child on %s (self backend): the only possible member list is [0]",
                        c->name);
    child = mc__self_new_comm(c->timeout_s, "self");
    if (!child) return MC__FAIL(MC_ERR_NO_MEMORY, "create_child on %s: out of memory", c->name);
    *out = child;
    return MC_OK;
}

static void mc__self_destroy(mc_comm *c) {
    mc__self_state *s = (mc__self_state *)c->impl;
    if (!s) return;
    while (s->messages) {
        mc__self_message *m = s->messages;
        s->messages = m->next;
        mc_ops_free(c->mem, m->data);
        mc_free(m);
    }
    while (s->pending) {
        mc__self_pending *p = s->pending;
        s->pending = p->next;
        mc_free(p);
    }
    mc_free(s);
    c->impl = NULL;
}

/* Positional, in mc_comm_ops field order (C++ has no designated initialisers before C++20). */
static const mc_comm_ops *mc__self_ops(void) {
    static const mc_comm_ops ops = {
        /* name            */ "self",
        /* all_reduce      */ mc__self_all_reduce,
        /* all_gather      */ mc__self_all_gather,
        /* reduce_scatter  */ mc__self_reduce_scatter,
        /* broadcast       */ mc__self_broadcast,
        /* send            */ mc__self_send,
        /* recv            */ mc__self_recv,
        /* batch_send_recv */ mc__self_batch,
        /* barrier         */ mc__self_barrier,
        /* wait            */ mc__self_wait,
        /* test            */ mc__self_test,
        /* create_child    */ mc__self_create_child,
        /* destroy         */ mc__self_destroy,
        /* mark_record     */ NULL,   /* blocking calls have finished when they return */
        /* mark_time       */ NULL,
        /* mark_release    */ NULL
    };
    return &ops;
}

static int mc__self_world(mc_comm **world, double timeout_s, const char *why,
                          const mc_ops *memory) {
    mc_comm *c = mc__self_new_comm(timeout_s, "world");
    if (!c) return MC__FAIL(MC_ERR_NO_MEMORY, "mc_comm_init_world: out of memory");
    c->backend_reason = why;
    mc__comm_take_memory(c, memory);   /* self copies through any table */
    c->world_ranks = (int *)mc_calloc(1, sizeof(int));
    if (!c->world_ranks) {
        mc__self_destroy(c);
        mc_free(c);
        return MC__FAIL(MC_ERR_NO_MEMORY, "mc_comm_init_world: out of memory");
    }
    *world = c;
    return MC_OK;
}

// ---------------------------------------------------------------------------------------------
// >>parallel_state.comm_mpi  Every operation is the nonblocking MPI call; blocking = start + wait, and wait
// polls MPI_Testall until done or until the communicator's timeout (MC_ERR_TIMEOUT, never a
// hang). AVG is SUM followed by a division. BF16 reductions return MC_ERR_UNSUPPORTED (MPI has
// no bf16 type); bf16 gathers, broadcasts and p2p move the raw 16-bit values.

#if defined(MC_COMM_MPI)

typedef struct mc__mpi_request {
    mc_request_head head;
    unsigned long long seq; /* the operation's number on its communicator */
    int n_reqs;
    MPI_Request *reqs;      /* &one, or an array for batches */
    MPI_Request one;
    void *scratch;          /* private copy of an aliased send buffer */
    void *avg_buf;          /* AVG: divide avg_count elements here by the size when done */
    size_t avg_count;
    mc_dtype avg_dtype;
    /* a device table's buffers (mc__mpi_staged): MPI works on host copies in `stage`; the
       received ones go back to the device when the request finishes */
    void *stage;
    struct mc__mpi_upload *up;
    int n_up;
} mc__mpi_request;

typedef struct mc__mpi_upload {
    void *dev;              /* device destination (op memory of the world's table) */
    const void *host;       /* its host copy inside the request's stage */
    size_t bytes;
} mc__mpi_upload;

static const mc_comm_ops *mc__mpi_ops(void);

static int mc__ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    const char *pa = (const char *)a, *pb = (const char *)b;
    if (!a || !b || a_bytes == 0 || b_bytes == 0) return 0;
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

/* Divides `count` elements in place by `divisor`: SUM then divide is how AVG is computed.
   Integer types use integer division (truncation toward zero). */
static int mc__divide(void *buf, size_t count, mc_dtype dt, int divisor) {
    size_t i;
    switch (dt) {
        case MC_F32: for (i = 0; i < count; i++) ((float *)buf)[i] /= (float)divisor; break;
        case MC_F64: for (i = 0; i < count; i++) ((double *)buf)[i] /= (double)divisor; break;
        case MC_I32: for (i = 0; i < count; i++) ((int32_t *)buf)[i] /= divisor; break;
        case MC_I64: for (i = 0; i < count; i++) ((int64_t *)buf)[i] /= divisor; break;
        case MC_U8:
            for (i = 0; i < count; i++)
                ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / divisor);
            break;
        default: return MC_ERR_UNSUPPORTED;
    }
    return MC_OK;
}

static MPI_Comm mc__mpi_handle(const mc_comm *c) { return *(const MPI_Comm *)c->mpi; }

static MPI_Datatype mc__mpi_dtype(mc_dtype dt) {
    switch (dt) {
        case MC_F32: return MPI_FLOAT;
        case MC_F64: return MPI_DOUBLE;
        case MC_I32: return MPI_INT32_T;
        case MC_I64: return MPI_INT64_T;
        case MC_U8: return MPI_UINT8_T;
        case MC_BF16: return MPI_UINT16_T;
        default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mc__mpi_op(mc_reduce_op op) {
    switch (op) {
        case MC_MAX: return MPI_MAX;
        case MC_MIN: return MPI_MIN;
        default: return MPI_SUM;   /* SUM, and AVG before its division */
    }
}

static int mc__mpi_fail(int mpi_rc, const mc_comm *c, const char *op) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    text[0] = '\0';
    MPI_Error_string(mpi_rc, text, &len);
    return MC__FAIL(MC_ERR_COMM, "%s on communicator %s (rank %d of %d) failed: %s", op, c->name,
                    c->rank, c->size, text);
}

/* >>comm_watchdog  A rank that makes no progress must not hang the job. See the manual at
   mc_comm_init_world. The watchdog lives on the world and is shared by its groups; its
   traffic runs over a private duplicate of MPI_COMM_WORLD, so it never meets user messages.
   Everything happens on the calling thread, inside waits and at the start of operations. */

enum { MC__WD_QUERY = 7101, MC__WD_REPLY = 7102, MC__WD_VERDICT = 7103, MC__WD_SLOTS = 64 };

typedef struct mc__wd_status {
    int rank;                  /* world rank of the sender */
    int waiting;               /* 1: inside a wait; 0: starting an operation */
    double waited_s;           /* how long it has waited so far */
    unsigned long long seq;    /* the operation's number on its communicator */
    char op[24];
    char comm[48];
} mc__wd_status;

typedef struct mc__watchdog {
    MPI_Comm comm;             /* duplicate of the world */
    int rank, size;
    double timeout_s;          /* mc_comm_desc.watchdog_s */
    const mc_comm *owner;      /* the world that made it (destroys it) */
    int broken;                /* a verdict was reached or received */
    char verdict[MC__ERROR_LEN];
    mc__wd_status now;         /* what this rank is doing (answers queries) */
    double since;              /* MPI_Wtime when the current wait began */
    MPI_Request send_req[MC__WD_SLOTS];   /* replies and verdicts in flight */
    mc__wd_status send_status[MC__WD_SLOTS];
    int query_in;              /* receive buffer for queries */
} mc__watchdog;

static double mc__wd_grace(double timeout_s) {
    double g = 0.1 * timeout_s;
    return g < 0.5 ? 0.5 : g > 10.0 ? 10.0 : g;
}

static int mc__wd_create(mc__watchdog **out, int rank, int size, double timeout_s) {
    mc__watchdog *wd = (mc__watchdog *)mc_calloc(1, sizeof *wd);
    int i;
    *out = NULL;
    if (!wd) return MC__FAIL(MC_ERR_NO_MEMORY, "mc_comm_init_world: out of memory (watchdog)");
    if (MPI_Comm_dup(MPI_COMM_WORLD, &wd->comm) != MPI_SUCCESS) {
        mc_free(wd);
        return MC__FAIL(MC_ERR_COMM, "mc_comm_init_world: MPI_Comm_dup for the watchdog failed");
    }
    MPI_Comm_set_errhandler(wd->comm, MPI_ERRORS_RETURN);
    wd->rank = rank;
    wd->size = size;
    wd->timeout_s = timeout_s;
    for (i = 0; i < MC__WD_SLOTS; i++) wd->send_req[i] = MPI_REQUEST_NULL;
    *out = wd;
    return MC_OK;
}

static void mc__wd_destroy(mc__watchdog *wd) {
    int i;
    if (!wd) return;
    if (!wd->broken) {
        for (i = 0; i < MC__WD_SLOTS; i++)
            if (wd->send_req[i] != MPI_REQUEST_NULL) MPI_Request_free(&wd->send_req[i]);
        MPI_Comm_free(&wd->comm);
    }
    mc_free(wd);   /* once broken, MPI may still read the slots of the sends: they leak */
}

/* A free send slot (finished sends are reaped first), or -1 when all are in flight. */
static int mc__wd_slot(mc__watchdog *wd) {
    int i, done;
    for (i = 0; i < MC__WD_SLOTS; i++) {
        if (wd->send_req[i] == MPI_REQUEST_NULL) return i;
        done = 0;
        MPI_Test(&wd->send_req[i], &done, MPI_STATUS_IGNORE);
        if (done) return i;
    }
    return -1;
}

static void mc__wd_send_bytes(mc__watchdog *wd, const void *data, int bytes, int to, int tag) {
    int k = mc__wd_slot(wd);
    if (k < 0 || bytes > (int)sizeof wd->send_status[k]) {
        /* the slot buffer holds a status; larger texts go through a heap copy that leaks
           (verdicts only: a handful per job) */
        void *copy = mc_malloc((size_t)bytes);
        MPI_Request r;
        if (!copy) return;
        memcpy(copy, data, (size_t)bytes);
        if (MPI_Isend(copy, bytes, MPI_BYTE, to, tag, wd->comm, &r) == MPI_SUCCESS)
            MPI_Request_free(&r);
        return;
    }
    memcpy(&wd->send_status[k], data, (size_t)bytes);
    MPI_Isend(&wd->send_status[k], bytes, MPI_BYTE, to, tag, wd->comm, &wd->send_req[k]);
}

/* Answers queries and takes in verdicts that have arrived. Cheap when nothing came. */
static void mc__wd_service(mc__watchdog *wd) {
    for (;;) {
        int flag = 0, bytes = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, wd->comm, &flag, &st) != MPI_SUCCESS || !flag)
            return;
        MPI_Get_count(&st, MPI_BYTE, &bytes);
        if (st.MPI_TAG == MC__WD_QUERY) {
            mc__wd_status me = wd->now;
            MPI_Recv(&wd->query_in, (int)sizeof wd->query_in, MPI_BYTE, st.MPI_SOURCE,
                     MC__WD_QUERY, wd->comm, MPI_STATUS_IGNORE);
            me.rank = wd->rank;
            me.waited_s = me.waiting ? MPI_Wtime() - wd->since : 0.0;
            mc__wd_send_bytes(wd, &me, (int)sizeof me, st.MPI_SOURCE, MC__WD_REPLY);
        } else if (st.MPI_TAG == MC__WD_VERDICT) {
            char text[MC__ERROR_LEN];
            int n = bytes < (int)sizeof text ? bytes : (int)sizeof text;
            MPI_Recv(text, n, MPI_BYTE, st.MPI_SOURCE, MC__WD_VERDICT, wd->comm,
                     MPI_STATUS_IGNORE);
            text[sizeof text - 1] = '\0';
            if (!wd->broken) {
                wd->broken = 1;
                snprintf(wd->verdict, sizeof wd->verdict, "%s", text);
            }
        } else {   /* a late reply to an investigation that has ended */
            char drop[sizeof(mc__wd_status)];
            MPI_Recv(drop, (int)sizeof drop, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, wd->comm,
                     MPI_STATUS_IGNORE);
        }
    }
}

static void mc__wd_describe(char *buf, size_t cap, const mc__wd_status *s) {
    if (s->waiting)
        snprintf(buf, cap, "rank %d: waiting %.1f s in %s #%llu on %s", s->rank, s->waited_s,
                 s->op, s->seq, s->comm);
    else
        snprintf(buf, cap, "rank %d: starting %s #%llu on %s", s->rank, s->op, s->seq, s->comm);
}

/* This rank's wait (`own`, n_own requests) has run for timeout - grace: ask everyone, judge,
   tell everyone. Returns 1 when the own wait finished meanwhile (no verdict), 2 when some
   rank answered with recent progress (no verdict yet: ask again later), 0 after a verdict. */
static int mc__wd_investigate(mc__watchdog *wd, const mc_comm *c, int n_own, MPI_Request *own) {
    double timeout_s = wd->timeout_s, grace_used;
    int n = wd->size, i, answered = 0, stuck = 0, own_done = 0, progress = 0;
    mc__wd_status *replies = (mc__wd_status *)mc_calloc((size_t)n, sizeof *replies);
    MPI_Request *reqs = (MPI_Request *)mc_malloc(sizeof(MPI_Request) * (size_t)n);
    int *got = (int *)mc_calloc((size_t)n, sizeof *got);
    double grace = mc__wd_grace(timeout_s), start = MPI_Wtime();
    char text[MC__ERROR_LEN], line[192], members[96];
    size_t len = 0;
    int query = 1;
    if (!replies || !reqs || !got) {
        mc_free(replies);
        mc_free(reqs);
        mc_free(got);
        return 2;   /* out of memory: the plain timeout still ends the wait */
    }
    for (i = 0; i < n; i++) {
        reqs[i] = MPI_REQUEST_NULL;
        if (i == wd->rank) continue;
        MPI_Irecv(&replies[i], (int)sizeof replies[i], MPI_BYTE, i, MC__WD_REPLY, wd->comm,
                  &reqs[i]);
    }
    for (i = 0; i < n; i++)
        if (i != wd->rank) mc__wd_send_bytes(wd, &query, 1 * (int)sizeof query, i, MC__WD_QUERY);
    while (MPI_Wtime() - start < grace && answered < n - 1 && !wd->broken && !own_done) {
        for (i = 0; i < n; i++) {
            int done = 0;
            if (i == wd->rank || got[i]) continue;
            MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE);
            if (done) got[i] = 1, answered++;
        }
        if (MPI_Testall(n_own, own, &own_done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) own_done = 0;
        mc__wd_service(wd);
        sched_yield();
    }
    grace_used = MPI_Wtime() - start;
    for (i = 0; i < n; i++)
        if (i != wd->rank && !got[i]) {
            MPI_Cancel(&reqs[i]);
            MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);   /* a cancelled receive ends at once */
            stuck++;
        }
    /* A rank that answered from a wait it entered within the grace period, or from the
       start of an operation, is moving: that is no deadlock. */
    for (i = 0; i < n; i++)
        if (i != wd->rank && got[i] && (!replies[i].waiting || replies[i].waited_s < grace))
            progress = 1;
    if (wd->broken || own_done || (stuck == 0 && progress)) {
        /* another rank decided first (its verdict stands), or there was progress */
        mc_free(replies);
        mc_free(got);
        mc_free(reqs);
        return wd->broken ? 0 : own_done ? 1 : 2;
    }
    members[0] = '\0';
    if (c->world_ranks) {
        size_t m = 0;
        for (i = 0; i < c->size && m + 12 < sizeof members; i++)
            m += (size_t)snprintf(members + m, sizeof members - m, "%s%d", i ? "," : "[",
                                  c->world_ranks[i]);
        snprintf(members + m, sizeof members - m, "%s", i < c->size ? ",...]" : "]");
    }
    if (stuck > 0) {
        len += (size_t)snprintf(text + len, sizeof text - len, "watchdog: rank");
        for (i = 0; i < n && len < sizeof text; i++)
            if (i != wd->rank && !got[i])
                len += (size_t)snprintf(text + len, sizeof text - len, "%s %d",
                                        len > 14 ? "," : "", i);
        if (len < sizeof text)
            len += (size_t)snprintf(text + len, sizeof text - len,
                                    " made no progress: %s not answer within %.1f s (stopped, "
                                    "or busy outside megatron_c); ",
                                    stuck > 1 ? "they did" : "it did", grace_used);
    } else {
        len += (size_t)snprintf(text + len, sizeof text - len,
                                "watchdog: no rank made progress for %.1f s although every "
                                "rank answers: they wait in calls that do not match (a "
                                "deadlock or a mismatched schedule); ", timeout_s);
    }
    if (len < sizeof text)
        len += (size_t)snprintf(text + len, sizeof text - len,
                                "rank %d waited %.1f s in %s #%llu on %s (world ranks %s)",
                                wd->rank, MPI_Wtime() - wd->since, wd->now.op, wd->now.seq,
                                c->name, members);
    for (i = 0; i < n && len < sizeof text; i++) {
        if (i == wd->rank || !got[i]) continue;
        mc__wd_describe(line, sizeof line, &replies[i]);
        len += (size_t)snprintf(text + len, sizeof text - len, " | %s", line);
    }
    text[sizeof text - 1] = '\0';
    wd->broken = 1;
    snprintf(wd->verdict, sizeof wd->verdict, "%s", text);
    for (i = 0; i < n; i++)
        if (i != wd->rank) mc__wd_send_bytes(wd, text, (int)strlen(text) + 1, i, MC__WD_VERDICT);
    mc_free(replies);
    mc_free(got);
    mc_free(reqs);
    return 0;
}

/* Marks the start of a wait (what queries are answered with) and serves pending messages. */
static void mc__wd_enter(mc_comm *c, const char *op, unsigned long long seq) {
    mc__watchdog *wd = (mc__watchdog *)c->watchdog;
    if (!wd) return;
    wd->now.waiting = 1;
    wd->now.seq = seq;
    snprintf(wd->now.op, sizeof wd->now.op, "%s", op);
    snprintf(wd->now.comm, sizeof wd->now.comm, "%s", c->name);
    wd->since = MPI_Wtime();
    mc__wd_service(wd);
}

static void mc__wd_leave(mc_comm *c) {
    mc__watchdog *wd = (mc__watchdog *)c->watchdog;
    if (wd) wd->now.waiting = 0;
}

/* Polls until every request is done (1), the timeout passes (0), MPI reports an error (-1,
   with *mpi_rc) or the watchdog has a verdict (2: the text is mc_comm_watchdog_verdict).
   timeout_s <= 0 waits forever (the watchdog still watches). */
static int mc__mpi_poll(mc_comm *c, const char *op, unsigned long long seq, int n,
                        MPI_Request *reqs, double timeout_s, int *mpi_rc) {
    mc__watchdog *wd = (mc__watchdog *)c->watchdog;
    double start = MPI_Wtime(), suspect = 0.0;
    long polls = 0;
    if (wd) {
        if (wd->broken) return 2;
        mc__wd_enter(c, op, seq);
        if (wd->timeout_s > 0) suspect = wd->timeout_s - mc__wd_grace(wd->timeout_s);
    }
    for (;;) {
        int done = 0;
        double waited;
        int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            *mpi_rc = rc;
            mc__wd_leave(c);
            return -1;
        }
        if (done) {
            mc__wd_leave(c);
            return 1;
        }
        waited = MPI_Wtime() - start;
        if (wd && (polls & 31) == 0) {
            mc__wd_service(wd);
            if (!wd->broken && suspect > 0 && waited > suspect) {
                int outcome = mc__wd_investigate(wd, c, n, reqs);
                if (outcome == 1) {   /* finished while the others were asked */
                    mc__wd_leave(c);
                    return 1;
                }
                /* progress elsewhere: ask again after another grace period */
                suspect = MPI_Wtime() - start + mc__wd_grace(wd->timeout_s);
            }
            if (wd->broken) {
                mc__wd_leave(c);
                return 2;
            }
        }
        if (timeout_s > 0 && waited > timeout_s) {
            mc__wd_leave(c);
            return 0;
        }
        /* Ranks are often oversubscribed: give the core away between polls. */
        if (++polls > 64) sched_yield();
    }
}

/* The MC_ERR_TIMEOUT of a watchdog verdict, for a wait of `op` on `c`. */
static int mc__wd_fail(const mc_comm *c, const char *op) {
    const mc__watchdog *wd = (const mc__watchdog *)c->watchdog;
    return MC__FAIL(MC_ERR_TIMEOUT, "%s on communicator %s (rank %d of %d) stopped by the %s",
                    op, c->name, c->rank, c->size, wd ? wd->verdict : "watchdog");
}

static mc__mpi_request *mc__mpi_request_new(mc_comm *c, const char *op, int n_reqs) {
    mc__mpi_request *q = (mc__mpi_request *)mc_calloc(1, sizeof(mc__mpi_request));
    if (!q) return NULL;
    q->head.comm = c;
    q->head.op = op;
    q->seq = ++c->n_calls;
    q->n_reqs = n_reqs;
    q->reqs = &q->one;
    q->one = MPI_REQUEST_NULL;
    if (n_reqs > 1) {
        int i;
        q->reqs = (MPI_Request *)mc_malloc(sizeof(MPI_Request) * (size_t)n_reqs);
        if (!q->reqs) {
            mc_free(q);
            return NULL;
        }
        for (i = 0; i < n_reqs; i++) q->reqs[i] = MPI_REQUEST_NULL;
    }
    return q;
}

/* After a timeout MPI may still read the scratch copy, so it is left allocated then. */
static void mc__mpi_request_free(mc__mpi_request *q, int keep_scratch) {
    if (!keep_scratch) mc_free(q->scratch), mc_free(q->stage);
    mc_free(q->up);
    if (q->reqs != &q->one) mc_free(q->reqs);
    mc_free(q);
}

/* Done: AVG divides (on the host copy when staged), then staged results go to the device. */
static int mc__mpi_finish(mc__mpi_request *q) {
    mc_comm *c = q->head.comm;
    int rc = MC_OK, i;
    if (q->avg_buf) rc = mc__divide(q->avg_buf, q->avg_count, q->avg_dtype, c->size);
    for (i = 0; rc == MC_OK && i < q->n_up; i++)
        if (q->up[i].bytes) rc = c->mem->upload(c->mem, q->up[i].dev, q->up[i].host, q->up[i].bytes);
    mc__mpi_request_free(q, 0);
    return rc;
}

static int mc__mpi_wait(mc_request *req, double timeout_s) {
    mc__mpi_request *q = (mc__mpi_request *)req;
    mc_comm *c = q->head.comm;
    int mpi_rc = MPI_SUCCESS;
    int state = mc__mpi_poll(c, q->head.op, q->seq, q->n_reqs, q->reqs, timeout_s, &mpi_rc);
    if (state == 1) return mc__mpi_finish(q);
    if (state == 2) {
        const char *op = q->head.op;
        mc__mpi_request_free(q, 1);
        return mc__wd_fail(c, op);
    }
    if (state < 0) {
        int rc = mc__mpi_fail(mpi_rc, c, q->head.op);
        mc__mpi_request_free(q, 1);
        return rc;
    }
    {
        const char *op = q->head.op;
        mc__mpi_request_free(q, 1);
        return MC__FAIL(MC_ERR_TIMEOUT,
                        "%s on communicator %s (rank %d of %d) did not complete within %.1f s: a "
                        "peer did not take part (the communicator should not be used again)",
                        op, c->name, c->rank, c->size, timeout_s);
    }
}

static int mc__mpi_test(mc_request *req, int *done) {
    mc__mpi_request *q = (mc__mpi_request *)req;
    mc__watchdog *wd = (mc__watchdog *)q->head.comm->watchdog;
    int rc;
    if (wd) mc__wd_service(wd);
    if (wd && wd->broken) {   /* a caller polling mc_test must not spin on a dead job */
        mc_comm *c = q->head.comm;
        const char *op = q->head.op;
        mc__mpi_request_free(q, 1);
        *done = 1;
        return mc__wd_fail(c, op);
    }
    rc = MPI_Testall(q->n_reqs, q->reqs, done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        int status = mc__mpi_fail(rc, q->head.comm, q->head.op);
        mc__mpi_request_free(q, 1);
        *done = 1;
        return status;
    }
    return *done ? mc__mpi_finish(q) : MC_OK;
}

/* Hands the started request to the caller (async) or waits for it (blocking). */
static int mc__mpi_complete(mc__mpi_request *q, int mpi_rc, mc_request **req) {
    mc_comm *c = q->head.comm;
    if (mpi_rc != MPI_SUCCESS) {
        int rc = mc__mpi_fail(mpi_rc, c, q->head.op);
        mc__mpi_request_free(q, 0);
        return rc;
    }
    if (req) {
        *req = (mc_request *)q;
        return MC_OK;
    }
    return mc__mpi_wait((mc_request *)q, c->timeout_s);
}

static int mc__mpi_check_count(const mc_comm *c, const char *op, size_t count) {
    if (count > (size_t)INT_MAX)
        return MC__FAIL(MC_ERR_UNSUPPORTED, "%s on %s: count (%zu) exceeds INT_MAX, MPI's limit",
                        op, c->name, count);
    return MC_OK;
}

static int mc__mpi_check_reduction(const mc_comm *c, const char *op, mc_dtype dt) {
    if (dt == MC_BF16)
        return MC__FAIL(MC_ERR_UNSUPPORTED,
                        "%s on %s: bf16 reductions are not supported by the mpi backend (MPI has "
                        "no bf16 type); reduce in f32",
                        op, c->name);
    return MC_OK;
}

/* A send buffer that overlaps the receive buffer (other than MPI_IN_PLACE) is copied first. */
static const void *mc__mpi_unalias(mc__mpi_request *q, const void *send, size_t send_bytes,
                                   const void *recv, size_t recv_bytes) {
    if (!mc__ranges_overlap(send, send_bytes, recv, recv_bytes)) return send;
    q->scratch = mc_malloc(send_bytes);
    if (!q->scratch) return NULL;
    memcpy(q->scratch, send, send_bytes);
    return q->scratch;
}

/* MPI here is not CUDA-aware: a world whose table keeps its memory on a device (ranks that
   share a GPU, so NCCL cannot hold them) hands MPI host copies. The send side is downloaded
   when the operation starts (download waits for the kernels that wrote it); the receive side
   is uploaded when the request finishes. Correct for every operation, at the price of two
   copies through the host per call. mc_host_collective's buffers are on the host already:
   they go to MPI as they are. */
static int mc__mpi_staged(const mc_comm *c) {
    return c->mem->device != MC_DEVICE_CPU && !c->mc__host_buffers;
}

/* One host block of `bytes` for the request's copies, and room for `n_up` uploads. */
static char *mc__mpi_stage_new(mc__mpi_request *q, size_t bytes, int n_up) {
    q->stage = mc_malloc(bytes ? bytes : 1);
    q->up = (mc__mpi_upload *)mc_calloc((size_t)(n_up > 0 ? n_up : 1), sizeof(mc__mpi_upload));
    return q->stage && q->up ? (char *)q->stage : NULL;
}

/* Downloads `bytes` of device memory into the host copy (nothing for 0 bytes). */
static int mc__mpi_stage_in(mc_comm *c, void *host, const void *dev, size_t bytes) {
    return bytes ? c->mem->download(c->mem, host, dev, bytes) : MC_OK;
}

/* Uploads the host copy to `dev` when the request finishes. */
static void mc__mpi_stage_out(mc__mpi_request *q, void *dev, const void *host, size_t bytes) {
    mc__mpi_upload *u = &q->up[q->n_up++];
    u->dev = dev, u->host = host, u->bytes = bytes;
}

/* Staging failed before MPI started: frees the request, returns the status. */
static int mc__mpi_stage_fail(mc__mpi_request *q, int rc, const char *op, size_t bytes) {
    mc_comm *c = q->head.comm;
    mc__mpi_request_free(q, 0);
    if (rc != MC_OK) return rc;
    return MC__FAIL(MC_ERR_NO_MEMORY, "%s on %s: no %zu bytes of host memory to stage the "
                    "'%s' table's device buffers", op, c->name, bytes, c->mem->name ? c->mem->name : "?");
}

static int mc__mpi_all_reduce(mc_comm *c, const void *send, void *recv, size_t count,
                              mc_dtype dt, mc_reduce_op op, mc_request **req) {
    size_t bytes = count * mc_dtype_size(dt);
    mc__mpi_request *q;
    const void *src;
    int rc;
    if ((rc = mc__mpi_check_count(c, "all_reduce", count)) != MC_OK) return rc;
    if ((rc = mc__mpi_check_reduction(c, "all_reduce", dt)) != MC_OK) return rc;
    q = mc__mpi_request_new(c, "all_reduce", 1);
    if (!q) return MC__FAIL(MC_ERR_NO_MEMORY, "all_reduce on %s: out of memory", c->name);
    if (mc__mpi_staged(c)) {   /* [send | recv] on the host, or one buffer in place */
        size_t need = send == recv ? bytes : 2 * bytes;
        char *h = mc__mpi_stage_new(q, need, 1);
        if (!h) return mc__mpi_stage_fail(q, MC_OK, "all_reduce", need);
        char *hr = send == recv ? h : h + bytes;
        if ((rc = mc__mpi_stage_in(c, send == recv ? hr : h, send, bytes)) != MC_OK)
            return mc__mpi_stage_fail(q, rc, "all_reduce", need);
        mc__mpi_stage_out(q, recv, hr, bytes);
        send = send == recv ? hr : h;
        recv = hr;
    }
    src = send == recv ? MPI_IN_PLACE : mc__mpi_unalias(q, send, bytes, recv, bytes);
    if (!src) {
        mc__mpi_request_free(q, 0);
        return MC__FAIL(MC_ERR_NO_MEMORY, "all_reduce on %s: out of memory", c->name);
    }
    if (op == MC_AVG) {
        q->avg_buf = recv;
        q->avg_count = count;
        q->avg_dtype = dt;
    }
    rc = MPI_Iallreduce(src, recv, (int)count, mc__mpi_dtype(dt), mc__mpi_op(op),
                        mc__mpi_handle(c), &q->one);
    return mc__mpi_complete(q, rc, req);
}

static int mc__mpi_all_gather(mc_comm *c, const void *send, void *recv, size_t count,
                              mc_dtype dt, mc_request **req) {
    size_t bytes = count * mc_dtype_size(dt);
    const char *own_slot = (const char *)recv + bytes * (size_t)c->rank;
    mc__mpi_request *q;
    const void *src;
    int rc;
    if ((rc = mc__mpi_check_count(c, "all_gather", count)) != MC_OK) return rc;
    q = mc__mpi_request_new(c, "all_gather", 1);
    if (!q) return MC__FAIL(MC_ERR_NO_MEMORY, "all_gather on %s: out of memory", c->name);
    if (mc__mpi_staged(c)) {   /* [recv] with the own slot filled in place, or [send | recv] */
        int in_place = (const char *)send == own_slot;
        size_t all = bytes * (size_t)c->size, need = in_place ? all : bytes + all;
        char *h = mc__mpi_stage_new(q, need, 1);
        if (!h) return mc__mpi_stage_fail(q, MC_OK, "all_gather", need);
        char *hr = in_place ? h : h + bytes;
        char *hs = in_place ? hr + bytes * (size_t)c->rank : h;
        if ((rc = mc__mpi_stage_in(c, hs, send, bytes)) != MC_OK)
            return mc__mpi_stage_fail(q, rc, "all_gather", need);
        mc__mpi_stage_out(q, recv, hr, all);
        send = hs;
        recv = hr;
        own_slot = hr + bytes * (size_t)c->rank;
    }
    src = (const char *)send == own_slot
              ? MPI_IN_PLACE
              : mc__mpi_unalias(q, send, bytes, recv, bytes * (size_t)c->size);
    if (!src) {
        mc__mpi_request_free(q, 0);
        return MC__FAIL(MC_ERR_NO_MEMORY, "all_gather on %s: out of memory", c->name);
    }
    rc = MPI_Iallgather(src, (int)count, mc__mpi_dtype(dt), recv, (int)count, mc__mpi_dtype(dt),
                        mc__mpi_handle(c), &q->one);
    return mc__mpi_complete(q, rc, req);
}

static int mc__mpi_reduce_scatter(mc_comm *c, const void *send, void *recv, size_t recv_count,
                                  mc_dtype dt, mc_reduce_op op, mc_request **req) {
    size_t bytes = recv_count * mc_dtype_size(dt);
    mc__mpi_request *q;
    const void *src;
    int rc;
    if ((rc = mc__mpi_check_count(c, "reduce_scatter", recv_count)) != MC_OK) return rc;
    if ((rc = mc__mpi_check_reduction(c, "reduce_scatter", dt)) != MC_OK) return rc;
    q = mc__mpi_request_new(c, "reduce_scatter", 1);
    if (!q) return MC__FAIL(MC_ERR_NO_MEMORY, "reduce_scatter on %s: out of memory", c->name);
    if (mc__mpi_staged(c)) {   /* [send | recv] on the host */
        size_t all = bytes * (size_t)c->size, need = all + bytes;
        char *h = mc__mpi_stage_new(q, need, 1);
        if (!h) return mc__mpi_stage_fail(q, MC_OK, "reduce_scatter", need);
        if ((rc = mc__mpi_stage_in(c, h, send, all)) != MC_OK)
            return mc__mpi_stage_fail(q, rc, "reduce_scatter", need);
        mc__mpi_stage_out(q, recv, h + all, bytes);
        send = h;
        recv = h + all;
    }
    src = mc__mpi_unalias(q, send, bytes * (size_t)c->size, recv, bytes);
    if (!src) {
        mc__mpi_request_free(q, 0);
        return MC__FAIL(MC_ERR_NO_MEMORY, "reduce_scatter on %s: out of memory", c->name);
    }
    if (op == MC_AVG) {
        q->avg_buf = recv;
        q->avg_count = recv_count;
        q->avg_dtype = dt;
    }
    rc = MPI_Ireduce_scatter_block(src, recv, (int)recv_count, mc__mpi_dtype(dt), mc__mpi_op(op),
                                   mc__mpi_handle(c), &q->one);
    return mc__mpi_complete(q, rc, req);
}

static int mc__mpi_broadcast(mc_comm *c, void *buf, size_t count, mc_dtype dt, int root,
                             mc_request **req) {
    mc__mpi_request *q;
    int rc;
    if ((rc = mc__mpi_check_count(c, "broadcast", count)) != MC_OK) return rc;
    q = mc__mpi_request_new(c, "broadcast", 1);
    if (!q) return MC__FAIL(MC_ERR_NO_MEMORY, "broadcast on %s: out of memory", c->name);
    if (mc__mpi_staged(c)) {   /* the root sends its host copy; the others upload theirs */
        size_t bytes = count * mc_dtype_size(dt);
        char *h = mc__mpi_stage_new(q, bytes, 1);
        if (!h) return mc__mpi_stage_fail(q, MC_OK, "broadcast", bytes);
        if (c->rank == root && (rc = mc__mpi_stage_in(c, h, buf, bytes)) != MC_OK)
            return mc__mpi_stage_fail(q, rc, "broadcast", bytes);
        if (c->rank != root) mc__mpi_stage_out(q, buf, h, bytes);
        buf = h;
    }
    rc = MPI_Ibcast(buf, (int)count, mc__mpi_dtype(dt), root, mc__mpi_handle(c), &q->one);
    return mc__mpi_complete(q, rc, req);
}

static int mc__mpi_batch(mc_comm *c, const mc_p2p_op *ops, int n_ops, mc_request **req) {
    const char *name = n_ops == 1 ? (ops[0].is_send ? "send" : "recv") : "batch_send_recv";
    mc__mpi_request *q;
    int i, rc = MPI_SUCCESS;
    for (i = 0; i < n_ops; i++)
        if ((rc = mc__mpi_check_count(c, name, ops[i].count)) != MC_OK) return rc;
    q = mc__mpi_request_new(c, name, n_ops);
    if (!q) return MC__FAIL(MC_ERR_NO_MEMORY, "%s on %s: out of memory", name, c->name);
    char **host = NULL;   /* staged: each op's host copy */
    if (mc__mpi_staged(c)) {
        size_t need = 0, at = 0;
        for (i = 0; i < n_ops; i++) need += ops[i].count * mc_dtype_size(ops[i].dtype);
        host = (char **)mc_calloc((size_t)n_ops, sizeof(char *));
        char *h = host ? mc__mpi_stage_new(q, need, n_ops) : NULL;
        if (!h) {
            mc_free(host);
            return mc__mpi_stage_fail(q, MC_OK, name, need);
        }
        for (i = 0; i < n_ops; i++) {
            size_t bytes = ops[i].count * mc_dtype_size(ops[i].dtype);
            int st = MC_OK;
            host[i] = h + at;
            at += bytes;
            if (ops[i].is_send) st = mc__mpi_stage_in(c, host[i], ops[i].buf, bytes);
            else mc__mpi_stage_out(q, ops[i].buf, host[i], bytes);
            if (st != MC_OK) {
                mc_free(host);
                return mc__mpi_stage_fail(q, st, name, need);
            }
        }
    }
    for (i = 0; i < n_ops && rc == MPI_SUCCESS; i++) {
        const mc_p2p_op *op = &ops[i];
        void *buf = host ? host[i] : op->buf;
        if (op->is_send)
            rc = MPI_Isend(buf, (int)op->count, mc__mpi_dtype(op->dtype), op->peer, op->tag,
                           mc__mpi_handle(c), &q->reqs[i]);
        else
            rc = MPI_Irecv(buf, (int)op->count, mc__mpi_dtype(op->dtype), op->peer, op->tag,
                           mc__mpi_handle(c), &q->reqs[i]);
    }
    mc_free(host);
    return mc__mpi_complete(q, rc, req);
}

static int mc__mpi_send(mc_comm *c, const void *buf, size_t count, mc_dtype dt, int peer, int tag,
                        mc_request **req) {
    mc_p2p_op op = mc__p2p_one(1, buf, count, dt, peer, tag);
    return mc__mpi_batch(c, &op, 1, req);
}

static int mc__mpi_recv(mc_comm *c, void *buf, size_t count, mc_dtype dt, int peer, int tag,
                        mc_request **req) {
    mc_p2p_op op = mc__p2p_one(0, buf, count, dt, peer, tag);
    return mc__mpi_batch(c, &op, 1, req);
}

static int mc__mpi_barrier(mc_comm *c, mc_request **req) {
    mc__mpi_request *q = mc__mpi_request_new(c, "barrier", 1);
    if (!q) return MC__FAIL(MC_ERR_NO_MEMORY, "barrier on %s: out of memory", c->name);
    return mc__mpi_complete(q, MPI_Ibarrier(mc__mpi_handle(c), &q->one), req);
}

/* Wraps an MPI communicator (takes ownership of `handle`). */
static int mc__mpi_wrap(MPI_Comm handle, double timeout_s, const char *name, mc_comm **out) {
    mc_comm *c;
    int rank = 0, size = 0;
    MPI_Comm_set_errhandler(handle, MPI_ERRORS_RETURN);
    MPI_Comm_rank(handle, &rank);
    MPI_Comm_size(handle, &size);
    c = mc__comm_new(mc__mpi_ops(), MC_BACKEND_MPI, rank, size, timeout_s, name);
    if (c) c->mpi = mc_malloc(sizeof(MPI_Comm));
    if (!c || !c->mpi) {
        mc_free(c);
        MPI_Comm_free(&handle);
        return MC__FAIL(MC_ERR_NO_MEMORY, "creating communicator %s: out of memory", name);
    }
    *(MPI_Comm *)c->mpi = handle;
    *out = c;
    return MC_OK;
}

/* Member-only creation: MPI_Comm_create_group is collective over the members alone. */
static int mc__mpi_create_child(mc_comm *c, const int *members, int n_members, int seq,
                                mc_comm **out) {
    MPI_Group parent_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm handle = MPI_COMM_NULL;
    int rc = MPI_Comm_group(mc__mpi_handle(c), &parent_group);
    if (rc == MPI_SUCCESS) rc = MPI_Group_incl(parent_group, n_members, members, &group);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(mc__mpi_handle(c), group, seq, &handle);
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    if (parent_group != MPI_GROUP_NULL) MPI_Group_free(&parent_group);
    if (rc != MPI_SUCCESS) return mc__mpi_fail(rc, c, "create_child (MPI_Comm_create_group)");
    return mc__mpi_wrap(handle, c->timeout_s, "group", out);
}

static void mc__mpi_destroy(mc_comm *c) { (void)c; /* the MPI_Comm is freed by mc_comm_destroy */ }

/* Positional, in mc_comm_ops field order (C++ has no designated initialisers before C++20). */
static const mc_comm_ops *mc__mpi_ops(void) {
    static const mc_comm_ops ops = {
        /* name            */ "mpi",
        /* all_reduce      */ mc__mpi_all_reduce,
        /* all_gather      */ mc__mpi_all_gather,
        /* reduce_scatter  */ mc__mpi_reduce_scatter,
        /* broadcast       */ mc__mpi_broadcast,
        /* send            */ mc__mpi_send,
        /* recv            */ mc__mpi_recv,
        /* batch_send_recv */ mc__mpi_batch,
        /* barrier         */ mc__mpi_barrier,
        /* wait            */ mc__mpi_wait,
        /* test            */ mc__mpi_test,
        /* create_child    */ mc__mpi_create_child,
        /* destroy         */ mc__mpi_destroy,
        /* mark_record     */ NULL,   /* blocking calls have finished when they return */
        /* mark_time       */ NULL,
        /* mark_release    */ NULL
    };
    return &ops;
}

#if defined(MC_ENABLE_CUDA)
/* 1 if every rank of the job has a GPU of its own. Every rank must take the same path, so the
   local answers are combined with a MIN over the world. */
static int mc__mpi_every_rank_has_a_gpu(void) {
    MPI_Comm node;
    int local_rank = 0, local_size = 1, here, everywhere = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        MPI_Comm_rank(node, &local_rank);
        MPI_Comm_size(node, &local_size);
        MPI_Comm_free(&node);
    }
    here = mc__nccl_available(local_rank, local_size);
    MPI_Allreduce(&here, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return everywhere;
}
#endif

/* Picks the backend for AUTO and says why (logged at level 3). */
static mc_comm_backend mc__mpi_choose(int size, const char **why) {
#if defined(MC_ENABLE_CUDA)
    if (mc__mpi_every_rank_has_a_gpu()) {
        *why = "every rank has its own GPU: using NCCL";
        return MC_BACKEND_NCCL;
    }
    if (size > 1) {
        *why = "ranks share GPUs (or none is visible): using MPI";
        return MC_BACKEND_MPI;
    }
#else
    if (size > 1) {
        *why = "built without MC_ENABLE_CUDA and more than one rank: using MPI";
        return MC_BACKEND_MPI;
    }
#endif
    *why = "a single rank: using self";
    return MC_BACKEND_SELF;
}

static int mc__mpi_world(mc_comm **world, mc_comm_backend backend, double timeout_s,
                         double watchdog_s, int *argc, char ***argv, const mc_ops *memory) {
    int initialized = 0, finalized = 0, owns = 0, rank = 0, size = 1, rc;
    int chosen = backend == MC_BACKEND_AUTO;   /* AUTO may fall back from NCCL to MPI */
    const char *why = "requested by mc_comm_desc.backend";
    MPI_Comm dup = MPI_COMM_NULL;
    mc_comm *c = NULL;
    MPI_Finalized(&finalized);
    if (finalized)
        return MC__FAIL(MC_ERR_STATE, "mc_comm_init_world: MPI was already finalized");
    MPI_Initialized(&initialized);
    if (!initialized) {
        if (MPI_Init(argc, argv) != MPI_SUCCESS)
            return MC__FAIL(MC_ERR_COMM, "mc_comm_init_world: MPI_Init failed");
        owns = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (chosen) backend = mc__mpi_choose(size, &why);
#if !defined(MC_ENABLE_CUDA)
    if (backend == MC_BACKEND_NCCL) {
        if (owns) MPI_Finalize();
        return MC__FAIL(MC_ERR_UNSUPPORTED,
                        "mc_comm_desc.backend (nccl) needs a build with MC_ENABLE_CUDA");
    }
#endif
    if (backend == MC_BACKEND_SELF) {
        if (size > 1)
            MC__WARN("mc_comm_init_world: self backend on each of %d MPI ranks: every rank is "
                     "its own size-1 world",
                     size);
        rc = mc__self_world(&c, timeout_s, why, NULL);
    } else {
        MPI_Comm_dup(MPI_COMM_WORLD, &dup);   /* our traffic never meets the caller's */
        rc = mc__mpi_wrap(dup, timeout_s, "world", &c);
        if (rc == MC_OK) {
            int i;
            c->world_ranks = (int *)mc_malloc(sizeof(int) * (size_t)size);
            if (!c->world_ranks)
                rc = MC__FAIL(MC_ERR_NO_MEMORY, "mc_comm_init_world: out of memory");
            for (i = 0; rc == MC_OK && i < size; i++) c->world_ranks[i] = i;
            c->world_rank = rank;
        }
        if (rc == MC_OK && watchdog_s > 0 && size > 1) {
            mc__watchdog *wd = NULL;
            rc = mc__wd_create(&wd, rank, size, watchdog_s);
            if (rc == MC_OK) wd->owner = c, c->watchdog = wd;
        }
    }
    if (rc != MC_OK) {
        if (c) mc_comm_destroy(c);
        if (owns) MPI_Finalize();
        return rc;
    }
    c->owns_mpi_init = owns;
#if defined(MC_ENABLE_CUDA)
    if (backend == MC_BACKEND_NCCL) {
        c->backend = MC_BACKEND_NCCL;
        rc = mc__nccl_init_world(c, memory);   /* all ranks agree on its outcome */
        if (rc != MC_OK && chosen && size > 1 && !memory) {
            /* AUTO: the world is still a working MPI communicator, so fall back to it. */
            c->backend = MC_BACKEND_MPI;
            why = "NCCL could not start (see the warning): using MPI";
            MC__WARN("mc_comm_init_world: %s", mc_last_error());
        } else if (rc != MC_OK) {
            mc_comm_destroy(c);
            return rc;
        }
    }
#endif
    if (c->backend != MC_BACKEND_NCCL && (rc = mc__comm_take_memory(c, memory)) != MC_OK) {
        mc_comm_destroy(c);
        return rc;
    }
    c->backend_reason = why;
    if (rank == 0)
        MC__INFO("world: %d rank(s), backend %s (%s)", size, mc_backend_name(c->backend), why);
    *world = c;
    return MC_OK;
}

/* All-gather of host bytes over the parent's MPI communicator, bounded by its timeout. On a
   timeout MPI may still write `recv` later, so the caller must then leak it. */
static int mc__mpi_host_allgather(mc_comm *c, const void *send, void *recv, int bytes,
                                  const char *what) {
    MPI_Request req = MPI_REQUEST_NULL;
    int mpi_rc = MPI_Iallgather(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, mc__mpi_handle(c),
                                &req);
    int state;
    if (mpi_rc != MPI_SUCCESS) return mc__mpi_fail(mpi_rc, c, what);
    state = mc__mpi_poll(c, what, ++c->n_calls, 1, &req, c->timeout_s, &mpi_rc);
    if (state < 0) return mc__mpi_fail(mpi_rc, c, what);
    if (state == 2) return mc__wd_fail(c, what);
    if (state == 0)
        return MC__FAIL(MC_ERR_TIMEOUT,
                        "%s over %s (rank %d of %d) did not complete within %.1f s: a rank did "
                        "not make the same call",
                        what, c->name, c->rank, c->size, c->timeout_s);
    return MC_OK;
}

#endif /* MC_COMM_MPI */

// ---------------------------------------------------------------------------------------------
// >>parallel_state.comm  The generic layer: argument checks, then the backend's table.

static int mc__host_allgather(mc_comm *c, const void *send, void *recv, int bytes,
                              const char *what) {
#if defined(MC_COMM_MPI)
    if (c->mpi) return mc__mpi_host_allgather(c, send, recv, bytes, what);
#endif
    if (c->size == 1) {
        memcpy(recv, send, (size_t)bytes);
        return MC_OK;
    }
    return MC__FAIL(MC_ERR_UNSUPPORTED,
                    "%s over %s: the %s backend has no host path for a size-%d communicator",
                    what, c->name, mc_backend_name(c->backend), c->size);
}

MC_API int mc_comm_init_world(mc_comm **world, const mc_comm_desc *desc) {
    mc_comm_backend backend = desc ? desc->backend : MC_BACKEND_AUTO;
    double timeout_s = desc ? desc->timeout_s : 0.0;
    const mc_ops *memory = desc ? desc->memory : NULL;
    if (!world) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_comm_init_world: world must not be NULL");
    *world = NULL;
    if ((int)backend < (int)MC_BACKEND_AUTO || (int)backend > (int)MC_BACKEND_NCCL)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_comm_desc.backend (%d) must be one of MC_BACKEND_AUTO, _SELF, _MPI, "
                        "_NCCL",
                        (int)backend);
    if (timeout_s < 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_comm_desc.timeout_s (%g) must be >= 0 (0 selects %g s)", timeout_s,
                        MC__DEFAULT_TIMEOUT_S);
    if (timeout_s == 0) timeout_s = MC__DEFAULT_TIMEOUT_S;
    if (desc && !(desc->watchdog_s >= 0))
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_comm_desc.watchdog_s (%g) must be >= 0 (0: no watchdog)",
                        desc->watchdog_s);
#if defined(MC_COMM_MPI)
    /* The self backend never needs MPI, even in an MPI build. */
    if (backend == MC_BACKEND_SELF)
        return mc__self_world(world, timeout_s, "requested by mc_comm_desc.backend", memory);
    return mc__mpi_world(world, backend, timeout_s, desc ? desc->watchdog_s : 0.0,
                         desc ? desc->argc : NULL, desc ? desc->argv : NULL, memory);
#else
    if (backend == MC_BACKEND_MPI || backend == MC_BACKEND_NCCL)
        return MC__FAIL(MC_ERR_UNSUPPORTED,
                        "mc_comm_desc.backend (%s) needs a build with MC_COMM_MPI",
                        mc_backend_name(backend));
    MC__INFO("world: 1 rank, backend self (built without MC_COMM_MPI)");
    return mc__self_world(world, timeout_s, "built without MC_COMM_MPI", memory);
#endif
}

MC_API void mc_comm_destroy(mc_comm *c) {
    int owns_mpi, broken = 0;
    if (!c) return;
    mc__tl_forget_comm(c);   /* its pending timeline markers, before the stream goes */
    owns_mpi = c->owns_mpi_init;
#if defined(MC_COMM_MPI)
    /* After a watchdog verdict MPI_Comm_free and MPI_Finalize could wait for the stuck rank:
       the handles are left to the process exit. */
    broken = c->watchdog && ((mc__watchdog *)c->watchdog)->broken;
#endif
    if (c->ops && c->ops->destroy) c->ops->destroy(c);
#if defined(MC_COMM_MPI)
    if (c->mpi) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && !broken && *(MPI_Comm *)c->mpi != MPI_COMM_NULL)
            MPI_Comm_free((MPI_Comm *)c->mpi);
        mc_free(c->mpi);
    }
    if (c->watchdog && ((mc__watchdog *)c->watchdog)->owner == c)
        mc__wd_destroy((mc__watchdog *)c->watchdog);
#endif
    mc_free(c->world_ranks);
    mc_free(c);
#if defined(MC_COMM_MPI)
    if (owns_mpi && !broken) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
    }
#else
    (void)owns_mpi;
    (void)broken;
#endif
}

MC_API int mc_comm_abort(mc_comm *world, int exit_code) {
#if defined(MC_COMM_MPI)
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
    (void)world;
    return MC__FAIL(MC_ERR_STATE, "mc_comm_abort: MPI is not running (initialized %d, finalized "
                    "%d)", initialized, finalized);
#else
    (void)world;
    (void)exit_code;
    return MC__FAIL(MC_ERR_UNSUPPORTED, "mc_comm_abort: built without MC_COMM_MPI");
#endif
}

MC_API const char *mc_comm_watchdog_verdict(const mc_comm *c) {
#if defined(MC_COMM_MPI)
    const mc__watchdog *wd = c ? (const mc__watchdog *)c->watchdog : NULL;
    return wd && wd->broken ? wd->verdict : NULL;
#else
    (void)c;
    return NULL;
#endif
}

/* "model name : Intel(R) ..." lines of /proc/cpuinfo: the first model and the count. */
static void mc__cpu_info(mc_backend_info *out) {
    char line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':'), *v;
        size_t n;
        if (strncmp(line, "processor", 9) == 0) out->cpu_count++;
        if (strncmp(line, "model name", 10) != 0 || !colon || out->cpu_name[0]) continue;
        v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        n = strcspn(v, "\r\n");
        snprintf(out->cpu_name, sizeof out->cpu_name, "%.*s", (int)n, v);
    }
    fclose(f);
}

#if defined(MC_COMM_MPI)
static void mc__mpi_info(mc_backend_info *out) {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0, version = 0, subversion = 0;
    size_t line;
    if (MPI_Get_version(&version, &subversion) == MPI_SUCCESS)
        snprintf(out->mpi_version, sizeof out->mpi_version, "%d.%d", version, subversion);
    if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return;
    text[len < (int)sizeof text ? len : (int)sizeof text - 1] = '\0';
    line = strcspn(text, "\r\n");
    while (line > 0 && (text[line - 1] == ' ' || text[line - 1] == '\t')) line--;
    snprintf(out->mpi_library, sizeof out->mpi_library, "%.*s", (int)line, text);
}
#endif

MC_API int mc_backend_query(const mc_comm *world, mc_backend_info *out) {
    int cuda;
    if (!out) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_backend_query: out must not be NULL");
    memset(out, 0, sizeof *out);
    if (world) {
        snprintf(out->backend, sizeof out->backend, "%s", mc_backend_name(world->backend));
        snprintf(out->backend_reason, sizeof out->backend_reason, "%s",
                 world->backend_reason ? world->backend_reason : "");
        out->world_size = world->size;
    }
    mc__cpu_info(out);
#if defined(MC_COMM_MPI)
    mc__mpi_info(out);
#endif
#if defined(MC_ENABLE_CUDA)
    out->cuda_built = 1;
    mc__cuda_backend_info(out);
#endif
    cuda = world && (world->backend == MC_BACKEND_NCCL || world->mem->device == MC_DEVICE_CUDA);
    snprintf(out->device_kind, sizeof out->device_kind, "%s", cuda ? "cuda" : "cpu");
    snprintf(out->device_name, sizeof out->device_name, "%s", cuda ? out->gpu_name : out->cpu_name);
    out->device_count = cuda ? out->gpu_count : out->cpu_count;
    return MC_OK;
}

static int mc__check_comm(const mc_comm *c, const char *fn) {
    if (!c || !c->ops)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: communicator is NULL or destroyed", fn);
    return MC_OK;
}

// ---------------------------------------------------------------------------------------------
// >>comm_agree  Ranks compare their configuration before anything else (see mc_comm_agree).

#define MC__AGREE_MAGIC 0x4d43414752454531ULL   /* "MCAGREE1" */
#define MC__AGREE_TEXT 80

typedef struct mc__agree_summary {
    uint64_t magic;
    int64_t n_items;
    uint64_t names;
    uint64_t values;
} mc__agree_summary;

static uint64_t mc__agree_text_hash(uint64_t h, const char *text) {
    text = text ? text : "";
    return mc__fnv_bytes(h, text, strlen(text) + 1);   /* the NUL separates the items */
}

/* "ranks 2, 3" (at most 8 named) */
static void mc__agree_rank_list(char *buf, size_t cap, const int *ranks, int n) {
    size_t len = (size_t)snprintf(buf, cap, "%s", n == 1 ? "rank" : "ranks");
    int i;
    for (i = 0; i < n && i < 8 && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s %d", i ? "," : "", ranks[i]);
    if (n > 8 && len < cap) snprintf(buf + len, cap - len, " and %d more", n - 8);
}

MC_API int mc_comm_agree(mc_comm *c, const mc_agree_item *items, int n_items) {
    mc__agree_summary mine, *all = NULL;
    uint64_t *hashes = NULL;
    char *texts = NULL, text[MC__AGREE_TEXT];
    int rc, r, i, size, first = -1, *same = NULL, *other = NULL, n_same = 0, n_other = 0;
    char same_list[160], other_list[160];
    const char *value;
    if ((rc = mc__check_comm(c, "mc_comm_agree")) != MC_OK) return rc;
    if (n_items < 0 || (n_items > 0 && !items))
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_comm_agree: n_items (%d) must be >= 0 with items "
                        "set", n_items);
    size = c->size;
    memset(&mine, 0, sizeof mine);
    mine.magic = MC__AGREE_MAGIC;
    mine.n_items = n_items;
    mine.names = mine.values = MC__FNV_OFFSET;
    for (i = 0; i < n_items; i++) {
        mine.names = mc__agree_text_hash(mine.names, items[i].name);
        mine.values = mc__agree_text_hash(mine.values, items[i].value);
    }
    all = (mc__agree_summary *)mc_calloc((size_t)size, sizeof *all);
    same = (int *)mc_calloc((size_t)size, sizeof *same);
    other = (int *)mc_calloc((size_t)size, sizeof *other);
    if (!all || !same || !other) {
        rc = MC__FAIL(MC_ERR_NO_MEMORY, "mc_comm_agree: out of memory for %d ranks", size);
        goto done;
    }
    rc = mc__host_allgather(c, &mine, all, (int)sizeof mine, "configuration agreement");
    if (rc != MC_OK) {
        all = NULL;   /* MPI may still write it after a timeout */
        goto done;
    }
    for (r = 0; r < size; r++)
        if (all[r].magic != all[0].magic || all[r].n_items != all[0].n_items ||
            all[r].names != all[0].names) {
            rc = MC__FAIL(MC_ERR_INVALID_DESC,
                          "configuration differs between ranks: rank %d compares %lld items "
                          "but rank 0 compares %lld (or other names): the ranks run different "
                          "programs or versions",
                          r, (long long)all[r].n_items, (long long)all[0].n_items);
            goto done;
        }
    for (r = 1; r < size && all[r].values == all[0].values; r++) {}
    if (r == size) goto done;   /* every rank agrees: one collective */

    /* Some value differs: every rank knows it, so every rank takes the next two steps. */
    hashes = (uint64_t *)mc_calloc((size_t)size * (size_t)(n_items ? n_items : 1), sizeof *hashes);
    texts = (char *)mc_calloc((size_t)size, MC__AGREE_TEXT);
    if (!hashes || !texts) {
        rc = MC__FAIL(MC_ERR_NO_MEMORY, "mc_comm_agree: out of memory for %d ranks", size);
        goto done;
    }
    {
        uint64_t *my_hashes = (uint64_t *)mc_calloc((size_t)(n_items ? n_items : 1), sizeof *my_hashes);
        if (!my_hashes) {
            rc = MC__FAIL(MC_ERR_NO_MEMORY, "mc_comm_agree: out of memory");
            goto done;
        }
        for (i = 0; i < n_items; i++)
            my_hashes[i] = mc__agree_text_hash(MC__FNV_OFFSET, items[i].value);
        rc = mc__host_allgather(c, my_hashes, hashes, (int)(sizeof *hashes * (size_t)n_items),
                                "configuration agreement (items)");
        mc_free(my_hashes);
        if (rc != MC_OK) {
            hashes = NULL;
            goto done;
        }
    }
    for (i = 0; i < n_items && first < 0; i++)
        for (r = 1; r < size; r++)
            if (hashes[(size_t)r * (size_t)n_items + (size_t)i] != hashes[i]) first = i;
    if (first < 0) first = 0;   /* unreachable: the summary hashes differed */
    value = items[first].value ? items[first].value : "";
    memset(text, 0, sizeof text);
    snprintf(text, sizeof text, "%s", value);
    if (strlen(value) >= sizeof text) memcpy(text + sizeof text - 4, "...", 4);
    rc = mc__host_allgather(c, text, texts, MC__AGREE_TEXT, "configuration agreement (value)");
    if (rc != MC_OK) {
        texts = NULL;
        goto done;
    }
    for (r = 0; r < size; r++) {
        int agrees = hashes[(size_t)r * (size_t)n_items + (size_t)first] == hashes[first];
        if (agrees) same[n_same++] = r;
        else other[n_other++] = r;
    }
    mc__agree_rank_list(same_list, sizeof same_list, same, n_same);
    mc__agree_rank_list(other_list, sizeof other_list, other, n_other);
    texts[(size_t)other[0] * MC__AGREE_TEXT + MC__AGREE_TEXT - 1] = '\0';
    texts[MC__AGREE_TEXT - 1] = '\0';
    rc = MC__FAIL(MC_ERR_INVALID_DESC,
                  "configuration differs between ranks: %s is \"%s\" on %s but \"%s\" on %s "
                  "(every rank must get the same value)",
                  items[first].name ? items[first].name : "?",
                  texts + (size_t)other[0] * MC__AGREE_TEXT, other_list, texts, same_list);
done:
    mc_free(all);
    mc_free(hashes);
    mc_free(texts);
    mc_free(same);
    mc_free(other);
    return rc;
}

static int mc__check_data(const mc_comm *c, const char *fn, const void *a, const void *b,
                          size_t count, mc_dtype dt) {
    if ((int)dt < 0 || (int)dt >= (int)MC_DTYPE_COUNT)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s on %s: dtype (%d) is not an mc_dtype", fn,
                        c->name, (int)dt);
    if (count > 0 && (!a || !b))
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s on %s: buffers must be set when count (%zu) > 0",
                        fn, c->name, count);
    return MC_OK;
}

static int mc__check_reduce_op(const mc_comm *c, const char *fn, mc_reduce_op op) {
    if ((int)op < (int)MC_SUM || (int)op > (int)MC_AVG)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s on %s: op (%d) must be MC_SUM, MC_MAX, MC_MIN or "
                        "MC_AVG", fn, c->name, (int)op);
    return MC_OK;
}

static int mc__check_peer(const mc_comm *c, const char *fn, const char *field, int peer) {
    if (peer < 0 || peer >= c->size)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s on %s: %s (%d) must be in [0, size = %d)", fn,
                        c->name, field, peer, c->size);
    return MC_OK;
}

static int mc__check_req(const mc_comm *c, const char *fn, mc_request **req) {
    if (!req)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s on %s: req must not be NULL", fn, c->name);
    *req = NULL;
    return MC_OK;
}

/* Every communication call of the generic layer goes through here: `call` is the backend's,
   recorded on the timeline (>>core.timeline) as a collective, or as an async operation whose
   request carries the event's id to mc_wait / mc_test. */
static int mc__tl_comm_done(long long ev, mc_comm *c, mc_request **req, int rc) {
    mc_timeline_event *e;
    if (req && rc == MC_OK && *req) ((mc_request_head *)*req)->timeline_id = ev;
    if (ev < 0) return rc;
    mc__tl_close(ev, rc, NULL, c);
    e = mc__tl_find(mc__tl, ev);
    if (e && req && rc == MC_OK && !*req) mc__tl_async_done(ev, e->t_return);   /* done at once */
    return rc;
}
#define MC__TL_COMM(c, req, name, bytes, call)                                                  \
    do {                                                                                        \
        long long ev_ = MC__TL_ON ? mc__tl_open((req) ? MC_TIMELINE_ASYNC : MC_TIMELINE_COLLECTIVE, \
                                                (name), -1, -1, (c), (bytes), 0)               \
                                  : -1;                                                         \
        return mc__tl_comm_done(ev_, (c), (req), (call));                                       \
    } while (0)

static int mc__do_all_reduce(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt,
                             mc_reduce_op op, mc_request **req, const char *fn) {
    int rc;
    if ((rc = mc__check_comm(c, fn)) != MC_OK) return rc;
    if (req && (rc = mc__check_req(c, fn, req)) != MC_OK) return rc;
    if ((rc = mc__check_data(c, fn, send, recv, count, dt)) != MC_OK) return rc;
    if ((rc = mc__check_reduce_op(c, fn, op)) != MC_OK) return rc;
    MC__TL_COMM(c, req, "all_reduce", mc_dtype_bytes(dt, count),
                c->ops->all_reduce(c, send, recv, count, dt, op, req));
}

static int mc__do_all_gather(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt,
                             mc_request **req, const char *fn) {
    int rc;
    if ((rc = mc__check_comm(c, fn)) != MC_OK) return rc;
    if (req && (rc = mc__check_req(c, fn, req)) != MC_OK) return rc;
    if ((rc = mc__check_data(c, fn, send, recv, count, dt)) != MC_OK) return rc;
    MC__TL_COMM(c, req, "all_gather", mc_dtype_bytes(dt, count),
                c->ops->all_gather(c, send, recv, count, dt, req));
}

static int mc__do_reduce_scatter(mc_comm *c, const void *send, void *recv, size_t recv_count,
                                 mc_dtype dt, mc_reduce_op op, mc_request **req, const char *fn) {
    int rc;
    if ((rc = mc__check_comm(c, fn)) != MC_OK) return rc;
    if (req && (rc = mc__check_req(c, fn, req)) != MC_OK) return rc;
    if ((rc = mc__check_data(c, fn, send, recv, recv_count, dt)) != MC_OK) return rc;
    if ((rc = mc__check_reduce_op(c, fn, op)) != MC_OK) return rc;
    MC__TL_COMM(c, req, "reduce_scatter", mc_dtype_bytes(dt, recv_count) * (size_t)c->size,
                c->ops->reduce_scatter(c, send, recv, recv_count, dt, op, req));
}

static int mc__do_broadcast(mc_comm *c, void *buf, size_t count, mc_dtype dt, int root,
                            mc_request **req, const char *fn) {
    int rc;
    if ((rc = mc__check_comm(c, fn)) != MC_OK) return rc;
    if (req && (rc = mc__check_req(c, fn, req)) != MC_OK) return rc;
    if ((rc = mc__check_data(c, fn, buf, buf, count, dt)) != MC_OK) return rc;
    if ((rc = mc__check_peer(c, fn, "root", root)) != MC_OK) return rc;
    MC__TL_COMM(c, req, "broadcast", mc_dtype_bytes(dt, count),
                c->ops->broadcast(c, buf, count, dt, root, req));
}

static int mc__check_p2p(const mc_comm *c, const char *fn, const mc_p2p_op *op) {
    int rc;
    if ((rc = mc__check_data(c, fn, op->buf, op->buf, op->count, op->dtype)) != MC_OK) return rc;
    if ((rc = mc__check_peer(c, fn, "peer", op->peer)) != MC_OK) return rc;
    if (op->tag < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s on %s: tag (%d) must be >= 0", fn, c->name,
                        op->tag);
    return MC_OK;
}

static int mc__do_p2p(mc_comm *c, int is_send, const void *buf, size_t count, mc_dtype dt,
                      int peer, int tag, mc_request **req, const char *fn) {
    mc_p2p_op op;
    int rc;
    if ((rc = mc__check_comm(c, fn)) != MC_OK) return rc;
    if (req && (rc = mc__check_req(c, fn, req)) != MC_OK) return rc;
    op.is_send = is_send;
    op.buf = (void *)(uintptr_t)buf;
    op.count = count;
    op.dtype = dt;
    op.peer = peer;
    op.tag = tag;
    if ((rc = mc__check_p2p(c, fn, &op)) != MC_OK) return rc;
    if (is_send)
        MC__TL_COMM(c, req, "send", mc_dtype_bytes(dt, count),
                    c->ops->send(c, buf, count, dt, peer, tag, req));
    MC__TL_COMM(c, req, "recv", mc_dtype_bytes(dt, count),
                c->ops->recv(c, op.buf, count, dt, peer, tag, req));
}

static int mc__do_batch(mc_comm *c, const mc_p2p_op *ops, int n_ops, mc_request **req,
                        const char *fn) {
    size_t bytes;
    int rc, i;
    if ((rc = mc__check_comm(c, fn)) != MC_OK) return rc;
    if (req && (rc = mc__check_req(c, fn, req)) != MC_OK) return rc;
    if (n_ops < 0 || (n_ops > 0 && !ops))
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s on %s: n_ops (%d) must be >= 0 with ops set", fn,
                        c->name, n_ops);
    for (i = 0, bytes = 0; i < n_ops; i++) {
        if ((rc = mc__check_p2p(c, fn, &ops[i])) != MC_OK) return rc;
        bytes += mc_dtype_bytes(ops[i].dtype, ops[i].count);
    }
    MC__TL_COMM(c, req, "batch_send_recv", bytes, c->ops->batch_send_recv(c, ops, n_ops, req));
}

static int mc__do_barrier(mc_comm *c, mc_request **req, const char *fn) {
    int rc;
    if ((rc = mc__check_comm(c, fn)) != MC_OK) return rc;
    if (req && (rc = mc__check_req(c, fn, req)) != MC_OK) return rc;
    MC__TL_COMM(c, req, "barrier", 0, c->ops->barrier(c, req));
}

MC_API int mc_all_reduce(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt,
                         mc_reduce_op op) {
    return mc__do_all_reduce(c, send, recv, count, dt, op, NULL, "mc_all_reduce");
}
MC_API int mc_all_gather(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt) {
    return mc__do_all_gather(c, send, recv, count, dt, NULL, "mc_all_gather");
}
MC_API int mc_reduce_scatter(mc_comm *c, const void *send, void *recv, size_t recv_count,
                             mc_dtype dt, mc_reduce_op op) {
    return mc__do_reduce_scatter(c, send, recv, recv_count, dt, op, NULL, "mc_reduce_scatter");
}
MC_API int mc_broadcast(mc_comm *c, void *buf, size_t count, mc_dtype dt, int root) {
    return mc__do_broadcast(c, buf, count, dt, root, NULL, "mc_broadcast");
}
MC_API int mc_send(mc_comm *c, const void *buf, size_t count, mc_dtype dt, int peer, int tag) {
    return mc__do_p2p(c, 1, buf, count, dt, peer, tag, NULL, "mc_send");
}
MC_API int mc_recv(mc_comm *c, void *buf, size_t count, mc_dtype dt, int peer, int tag) {
    return mc__do_p2p(c, 0, buf, count, dt, peer, tag, NULL, "mc_recv");
}
MC_API int mc_batch_send_recv(mc_comm *c, const mc_p2p_op *ops, int n_ops) {
    return mc__do_batch(c, ops, n_ops, NULL, "mc_batch_send_recv");
}
MC_API int mc_barrier(mc_comm *c) { return mc__do_barrier(c, NULL, "mc_barrier"); }

MC_API int mc_all_reduce_async(mc_comm *c, const void *send, void *recv, size_t count,
                               mc_dtype dt, mc_reduce_op op, mc_request **req) {
    if (!req) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_all_reduce_async: req must not be NULL");
    return mc__do_all_reduce(c, send, recv, count, dt, op, req, "mc_all_reduce_async");
}
MC_API int mc_all_gather_async(mc_comm *c, const void *send, void *recv, size_t count,
                               mc_dtype dt, mc_request **req) {
    if (!req) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_all_gather_async: req must not be NULL");
    return mc__do_all_gather(c, send, recv, count, dt, req, "mc_all_gather_async");
}
MC_API int mc_reduce_scatter_async(mc_comm *c, const void *send, void *recv, size_t recv_count,
                                   mc_dtype dt, mc_reduce_op op, mc_request **req) {
    if (!req) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_reduce_scatter_async: req must not be NULL");
    return mc__do_reduce_scatter(c, send, recv, recv_count, dt, op, req, "mc_reduce_scatter_async");
}
MC_API int mc_broadcast_async(mc_comm *c, void *buf, size_t count, mc_dtype dt, int root,
                              mc_request **req) {
    if (!req) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_broadcast_async: req must not be NULL");
    return mc__do_broadcast(c, buf, count, dt, root, req, "mc_broadcast_async");
}
MC_API int mc_send_async(mc_comm *c, const void *buf, size_t count, mc_dtype dt, int peer,
                         int tag, mc_request **req) {
    if (!req) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_send_async: req must not be NULL");
    return mc__do_p2p(c, 1, buf, count, dt, peer, tag, req, "mc_send_async");
}
MC_API int mc_recv_async(mc_comm *c, void *buf, size_t count, mc_dtype dt, int peer, int tag,
                         mc_request **req) {
    if (!req) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_recv_async: req must not be NULL");
    return mc__do_p2p(c, 0, buf, count, dt, peer, tag, req, "mc_recv_async");
}
MC_API int mc_batch_send_recv_async(mc_comm *c, const mc_p2p_op *ops, int n_ops,
                                    mc_request **req) {
    if (!req) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_batch_send_recv_async: req must not be NULL");
    return mc__do_batch(c, ops, n_ops, req, "mc_batch_send_recv_async");
}
MC_API int mc_barrier_async(mc_comm *c, mc_request **req) {
    if (!req) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_barrier_async: req must not be NULL");
    return mc__do_barrier(c, req, "mc_barrier_async");
}

/* The wait (or successful test) of an async operation on the timeline; the request is freed
   by the backend, so its head is read before. */
static long long mc__tl_wait_open(const mc_request_head *h) {
    long long ev = mc__tl_open(MC_TIMELINE_WAIT, h->op, -1, -1, h->comm, 0, 0);
    mc_timeline_event *e = mc__tl_find(mc__tl, ev);
    if (e) e->ref = h->timeline_id;
    return ev;
}
static void mc__tl_wait_close(long long ev, long long async_id, int rc) {
    mc_timeline_event *e;
    mc__tl_close(ev, rc, NULL, NULL);
    e = mc__tl_find(mc__tl, ev);
    if (e && rc == MC_OK) mc__tl_async_done(async_id, e->t_return);
}

MC_API int mc_wait(mc_request *req) {
    mc_comm *c;
    long long ev = -1, async_id = -1;
    int rc;
    if (!req) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_wait: req must not be NULL");
    c = ((mc_request_head *)req)->comm;
    if (MC__TL_ON) {
        async_id = ((mc_request_head *)req)->timeline_id;
        ev = mc__tl_wait_open((mc_request_head *)req);
    }
    rc = c->ops->wait(req, c->timeout_s);
    if (ev >= 0) mc__tl_wait_close(ev, async_id, rc);
    return rc;
}

/* *done = 1 means the operation finished and the request has been freed. */
MC_API int mc_test(mc_request *req, int *done) {
    mc_comm *c;
    long long ev = -1, async_id = -1;
    int rc;
    if (!req || !done) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_test: req and done must be set");
    c = ((mc_request_head *)req)->comm;
    if (!MC__TL_ON) return c->ops->test(req, done);
    async_id = ((mc_request_head *)req)->timeline_id;
    {
        mc_request_head head = *(mc_request_head *)req;
        double t0 = mc_timeline_now();
        rc = c->ops->test(req, done);
        if (*done) {   /* only a test that finds it done is recorded */
            mc_timeline_event *e;
            ev = mc__tl_wait_open(&head);
            e = mc__tl_find(mc__tl, ev);
            if (e) e->t_call = t0;
            mc__tl_wait_close(ev, async_id, rc);
        }
    }
    return rc;
}

MC_API const mc_ops *mc_comm_memory(const mc_comm *c) { return c ? c->mem : NULL; }

MC_API void *mc_comm_alloc(mc_comm *c, size_t bytes) {
    void *p = NULL;
    if (!c || !c->mem) return NULL;
    return mc_ops_alloc(c->mem, MC_MEMORY_COMMUNICATION, &p, bytes) == MC_OK ? p : NULL;
}
MC_API void mc_comm_free(mc_comm *c, void *ptr) {
    if (c && c->mem && ptr) mc_ops_free(c->mem, ptr);
}
MC_API int mc_comm_upload(mc_comm *c, void *dst, const void *host_src, size_t bytes) {
    int rc;
    if ((rc = mc__check_comm(c, "mc_comm_upload")) != MC_OK) return rc;
    if (bytes && (!dst || !host_src))
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_comm_upload: dst and host_src must be set");
    return bytes ? c->mem->upload(c->mem, dst, host_src, bytes) : MC_OK;
}
MC_API int mc_comm_download(mc_comm *c, void *host_dst, const void *src, size_t bytes) {
    int rc;
    if ((rc = mc__check_comm(c, "mc_comm_download")) != MC_OK) return rc;
    if (bytes && (!host_dst || !src))
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_comm_download: host_dst and src must be set");
    return bytes ? c->mem->download(c->mem, host_dst, src, bytes) : MC_OK;
}

static int mc__host_coll_run(mc_comm *c, mc_collective kind, const void *send, void *recv,
                             size_t count, mc_dtype dt, mc_reduce_op op, int root) {
    switch (kind) {
        case MC_COLL_ALL_REDUCE: return mc_all_reduce(c, send, recv, count, dt, op);
        case MC_COLL_ALL_GATHER: return mc_all_gather(c, send, recv, count, dt);
        default:
            if (c->rank == root && send != recv) memcpy(recv, send, mc_dtype_bytes(dt, count));
            return mc_broadcast(c, recv, count, dt, root);
    }
}

MC_API int mc_host_collective(mc_comm *c, mc_collective kind, const void *send, void *recv,
                              size_t count, mc_dtype dt, mc_reduce_op op, int root) {
    static const char fn[] = "mc_host_collective";
    size_t in_bytes, out_bytes;
    void *dsend = NULL, *drecv = NULL;
    int rc;
    if ((rc = mc__check_comm(c, fn)) != MC_OK) return rc;
    if ((int)kind < (int)MC_COLL_ALL_REDUCE || (int)kind > (int)MC_COLL_BROADCAST)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s on %s: kind (%d) is not an mc_collective", fn,
                        c->name, (int)kind);
    if (mc_dtype_size(dt) == 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s on %s: dtype (%d) is not an mc_dtype", fn,
                        c->name, (int)dt);
    if (count == 0) return MC_OK;
    if (!recv || (!send && (kind != MC_COLL_BROADCAST || c->rank == root)))
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s on %s: send and recv must be set", fn, c->name);
    if (c->mem->device == MC_DEVICE_CPU)
        return mc__host_coll_run(c, kind, send, recv, count, dt, op, root);
    if (c->backend == MC_BACKEND_MPI) {   /* MPI reads host memory: no copies through the table */
        c->mc__host_buffers = 1;
        rc = mc__host_coll_run(c, kind, send, recv, count, dt, op, root);
        c->mc__host_buffers = 0;
        return rc;
    }
    in_bytes = mc_dtype_bytes(dt, count);
    out_bytes = kind == MC_COLL_ALL_GATHER ? in_bytes * (size_t)c->size : in_bytes;
    if (mc_ops_alloc(c->mem, MC_MEMORY_COMMUNICATION, &dsend, in_bytes) != MC_OK ||
        mc_ops_alloc(c->mem, MC_MEMORY_COMMUNICATION, &drecv, out_bytes) != MC_OK) {
        rc = MC__FAIL(MC_ERR_NO_MEMORY, "%s on %s: no %zu bytes of staging memory (%s)", fn,
                      c->name, in_bytes + out_bytes, mc_last_error());
    } else if (kind == MC_COLL_BROADCAST) {
        rc = c->rank == root ? c->mem->upload(c->mem, drecv, send, in_bytes) : MC_OK;
        if (rc == MC_OK) rc = mc_broadcast(c, drecv, count, dt, root);
    } else {
        rc = c->mem->upload(c->mem, dsend, send, in_bytes);
        if (rc == MC_OK) rc = mc__host_coll_run(c, kind, dsend, drecv, count, dt, op, root);
    }
    if (rc == MC_OK) rc = c->mem->download(c->mem, recv, drecv, out_bytes);
    if (rc != MC_ERR_TIMEOUT) {   /* after a timeout the backend may still write them */
        if (dsend) mc_ops_free(c->mem, dsend);
        if (drecv) mc_ops_free(c->mem, drecv);
    }
    return rc;
}

/* Group creation ------------------------------------------------------------------------- */

/* What each caller of a collective creation tells the others. */
typedef struct mc__create_record {
    int32_t seq;
    int32_t is_member;
    int32_t n;
    int32_t pad;
    uint64_t hash;
} mc__create_record;

/* Part of a mismatch report: the first members of a caller's list. */
typedef struct mc__create_list {
    int32_t n;
    int32_t members[MC__LIST_SHOWN];
} mc__create_list;

static int mc__check_members(const mc_comm *parent, const int *members, int n, const char *fn) {
    int i, j;
    if (n < 1 || !members)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s over %s: n_members (%d) must be >= 1 with members "
                        "set", fn, parent->name, n);
    for (i = 0; i < n; i++) {
        if (members[i] < 0 || members[i] >= parent->size)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "%s over %s: members[%d] (%d) must be in [0, parent size = %d)", fn,
                            parent->name, i, members[i], parent->size);
        for (j = 0; j < i; j++)
            if (members[j] == members[i])
                return MC__FAIL(MC_ERR_INVALID_ARG,
                                "%s over %s: rank %d appears twice in members (positions %d and "
                                "%d)",
                                fn, parent->name, members[i], j, i);
    }
    return MC_OK;
}

static int mc__position_of(const int *list, int n, int value) {
    int i;
    for (i = 0; i < n; i++)
        if (list[i] == value) return i;
    return -1;
}

/* Backend child + the fields the generic layer owns (world ranks, name, timeout). */
static int mc__make_child(mc_comm *parent, const int *members, int n, int tag, const char *name,
                          mc_comm **out) {
    mc_comm *child = NULL;
    int i, rc = parent->ops->create_child(parent, members, n, tag, &child);
    if (rc != MC_OK) return rc;
    if (!child->world_ranks) {
        child->world_ranks = (int *)mc_malloc(sizeof(int) * (size_t)n);
        if (!child->world_ranks) {
            mc_comm_destroy(child);
            return MC__FAIL(MC_ERR_NO_MEMORY, "creating %s: out of memory", name);
        }
    }
    for (i = 0; i < n; i++)
        child->world_ranks[i] = parent->world_ranks ? parent->world_ranks[members[i]] : members[i];
    child->world_rank = parent->world_rank;
    child->mem = parent->mem;   /* one memory owner for the whole group tree */
    child->timeout_s = parent->timeout_s;
    child->watchdog = parent->watchdog;
    snprintf(child->name, sizeof child->name, "%s", name);
    *out = child;
    return MC_OK;
}

/* Both callers' lists were exchanged; report the first caller whose record differs from ours. */
static int mc__report_create_mismatch(mc_comm *parent, const mc__create_record *records,
                                      const int *members, int n, int seq) {
    mc__create_list mine, *all;
    const mc__create_record *me = &records[parent->rank];
    int i, b = -1, rc;
    char la[200], lb[200];
    for (i = 0; i < parent->size && b < 0; i++)
        if (records[i].hash != me->hash || records[i].seq != me->seq) b = i;
    memset(&mine, 0, sizeof mine);
    mine.n = n;
    for (i = 0; i < n && i < MC__LIST_SHOWN; i++) mine.members[i] = members[i];
    all = (mc__create_list *)mc_malloc(sizeof(mc__create_list) * (size_t)parent->size);
    if (!all) return MC__FAIL(MC_ERR_NO_MEMORY, "collective group creation: out of memory");
    rc = mc__host_allgather(parent, &mine, all, (int)sizeof mine,
                            "collective group creation (mismatch report)");
    if (rc != MC_OK) return rc;   /* `all` is leaked on purpose: MPI may still write it */
    mc__format_ranks(la, sizeof la, members, n, n);
    {
        int nb = all[b].n, known = nb < MC__LIST_SHOWN ? nb : MC__LIST_SHOWN;
        int theirs[MC__LIST_SHOWN];
        for (i = 0; i < known; i++) theirs[i] = all[b].members[i];
        mc__format_ranks(lb, sizeof lb, theirs, known, nb);
    }
    mc_free(all);
    if (records[b].seq != me->seq)
        return MC__FAIL(MC_ERR_PLAN_MISMATCH,
                        "collective group creation #%d over %s: rank %d creates %s but rank %d is "
                        "at its creation #%d with %s (the ranks made different numbers of "
                        "collective creations)",
                        seq, parent->name, parent->rank, la, b, (int)records[b].seq, lb);
    return MC__FAIL(MC_ERR_PLAN_MISMATCH,
                    "collective group creation #%d over %s: rank %d creates %s but rank %d "
                    "creates %s",
                    seq, parent->name, parent->rank, la, b, lb);
}

MC_API int mc_comm_create_group_ex(mc_comm *parent, const int *members, int n_members, int verify,
                                   mc_comm **out) {
    mc__create_record mine, *records;
    int *actual = NULL, n_actual = 0, i, rc, seq, agree = 1;
    char name[48];
    if ((rc = mc__check_comm(parent, "mc_comm_create_group")) != MC_OK) return rc;
    if (!out) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_comm_create_group: out must not be NULL");
    *out = NULL;
    if ((rc = mc__check_members(parent, members, n_members, "mc_comm_create_group")) != MC_OK)
        return rc;
    seq = ++parent->create_seq;
    memset(&mine, 0, sizeof mine);
    mine.seq = seq;
    mine.is_member = mc__position_of(members, n_members, parent->rank) >= 0;
    mine.n = n_members;
    mine.hash = mc__hash_ranks(MC__FNV_OFFSET, members, n_members);
    records = (mc__create_record *)mc_malloc(sizeof(mc__create_record) * (size_t)parent->size);
    if (!records) return MC__FAIL(MC_ERR_NO_MEMORY, "mc_comm_create_group: out of memory");
    {
        char what[96];
        snprintf(what, sizeof what, "collective group creation #%d", seq);
        rc = mc__host_allgather(parent, &mine, records, (int)sizeof mine, what);
    }
    if (rc != MC_OK) return rc;   /* on a timeout `records` is leaked on purpose */
    for (i = 0; i < parent->size; i++)
        if (records[i].hash != mine.hash || records[i].seq != mine.seq) agree = 0;
    if (verify && !agree) {
        rc = mc__report_create_mismatch(parent, records, members, n_members, seq);
        mc_free(records);
        return rc;
    }
    if (verify) {
        actual = (int *)members;
        n_actual = n_members;
    } else {
        /* Pair by position, as torch.distributed.new_group does: whoever flagged membership in
           this call joins, whatever list it passed. */
        actual = (int *)mc_malloc(sizeof(int) * (size_t)parent->size);
        if (!actual) {
            mc_free(records);
            return MC__FAIL(MC_ERR_NO_MEMORY, "mc_comm_create_group: out of memory");
        }
        for (i = 0; i < parent->size; i++)
            if (records[i].is_member) actual[n_actual++] = i;
    }
    mc_free(records);
    snprintf(name, sizeof name, "%.30s/#%d", parent->name, seq);
    if (mc__position_of(actual, n_actual, parent->rank) >= 0)
        rc = mc__make_child(parent, actual, n_actual, seq, name, out);
    if (actual != members) mc_free(actual);
    return rc;
}

MC_API int mc_comm_create_group(mc_comm *parent, const int *members, int n_members,
                                mc_comm **out) {
    return mc_comm_create_group_ex(parent, members, n_members, 1, out);
}

MC_API int mc_comm_create_group_local(mc_comm *parent, const int *members, int n_members, int tag,
                                      mc_comm **out) {
    char name[48];
    int rc;
    if ((rc = mc__check_comm(parent, "mc_comm_create_group_local")) != MC_OK) return rc;
    if (!out)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_comm_create_group_local: out must not be NULL");
    *out = NULL;
    if ((rc = mc__check_members(parent, members, n_members, "mc_comm_create_group_local")) != MC_OK)
        return rc;
    if (tag < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_comm_create_group_local over %s: tag (%d) must be "
                        ">= 0", parent->name, tag);
    if (mc__position_of(members, n_members, parent->rank) < 0)
        return MC__FAIL(MC_ERR_NOT_MEMBER,
                        "mc_comm_create_group_local over %s: rank %d is not in members; only "
                        "members call it",
                        parent->name, parent->rank);
    snprintf(name, sizeof name, "%.30s/local%d", parent->name, tag);
    return mc__make_child(parent, members, n_members, tag, name, out);
}

// ---------------------------------------------------------------------------------------------
// >>parallel_state

/* What every rank tells the others before creating any group. */
typedef struct mc__plan_summary {
    uint64_t fingerprint;
    uint64_t salt;
    int32_t version;
    int32_t sizes[9];   /* world, tp, pp, vpp, cp, ep, etp, dp, edp */
    int32_t n_entries;
    char order[MC_ORDER_MAX];
} mc__plan_summary;

/* One plan entry as exchanged when the fingerprints differ (kind -1: past the end). */
typedef struct mc__plan_record {
    int32_t kind;
    int32_t index;
    uint64_t hash;
} mc__plan_record;

static void mc__plan_summarize(const mc_grid *g, uint64_t salt, mc__plan_summary *s) {
    memset(s, 0, sizeof *s);
    s->fingerprint = mc_grid_plan_fingerprint(g, salt);
    s->salt = salt;
    s->version = MC_VERSION_HEX;
    s->sizes[0] = g->desc.world;
    s->sizes[1] = g->desc.tp;
    s->sizes[2] = g->desc.pp;
    s->sizes[3] = g->desc.vpp;
    s->sizes[4] = g->desc.cp;
    s->sizes[5] = g->desc.ep;
    s->sizes[6] = g->desc.etp;
    s->sizes[7] = g->dp;
    s->sizes[8] = g->edp;
    s->n_entries = mc_grid_creation_plan(g, NULL, 0);
    snprintf(s->order, sizeof s->order, "%s", g->order);
}

static void mc__describe_summary(char *buf, size_t cap, int rank, const mc__plan_summary *s) {
    snprintf(buf, cap, "rank %d: tp=%d pp=%d cp=%d ep=%d etp=%d vpp=%d order=%s", rank,
             (int)s->sizes[1], (int)s->sizes[2], (int)s->sizes[4], (int)s->sizes[5],
             (int)s->sizes[6], (int)s->sizes[3], s->order);
}

/* Names what two summaries with identical groups disagree on. */
static const char *mc__summary_difference(const mc__plan_summary *a, const mc__plan_summary *b) {
    if (a->version != b->version) return "the library version";
    if (strcmp(a->order, b->order) != 0) return "the order string";
    if (memcmp(a->sizes, b->sizes, sizeof a->sizes) != 0) return "the sizes";
    if (a->salt != b->salt) return "plan_salt";
    return "the fingerprint alone";
}

/* Rebuilds a grid from another rank's summary (to print its member lists). */
static int mc__grid_from_summary(const mc__plan_summary *s, mc_grid *g) {
    mc_grid_desc d;
    mc_grid_desc *dp = &d;
    int rc;
    memset(dp, 0, sizeof d);
    d.world = s->sizes[0];
    d.tp = s->sizes[1];
    d.pp = s->sizes[2];
    d.vpp = s->sizes[3];
    d.cp = s->sizes[4];
    d.ep = s->sizes[5];
    d.etp = s->sizes[6];
    d.order = s->order;
    {
        /* Rebuilding must not overwrite this thread's error text. */
        char saved[MC__ERROR_LEN];
        memcpy(saved, mc__last_error_text, sizeof saved);
        rc = mc_grid_init(g, dp);
        memcpy(mc__last_error_text, saved, sizeof saved);
    }
    return rc;
}

static void mc__plan_records(const mc_grid *g, const mc_plan_entry *plan, int n, int padded,
                             int *members, mc__plan_record *out) {
    int i;
    for (i = 0; i < padded; i++) {
        out[i].kind = -1;
        out[i].index = -1;
        out[i].hash = 0;
        if (i < n) {
            int m = mc__grid_members(g, (int)plan[i].kind, plan[i].index, members);
            out[i].kind = (int32_t)plan[i].kind;
            out[i].index = plan[i].index;
            out[i].hash = mc__hash_ranks(MC__FNV_OFFSET, members, m);
        }
    }
}

/* "#12 pp[1] = [1,5]", or what is known when the grid cannot be rebuilt. */
static void mc__describe_entry(char *buf, size_t cap, int number, const mc__plan_record *rec,
                               const mc_grid *g, int *members) {
    char list[200];
    if (rec->kind < 0) {
        snprintf(buf, cap, "nothing at #%d (its plan is shorter)", number);
        return;
    }
    if (g) {
        int m = mc__grid_members(g, rec->kind, rec->index, members);
        if (m > 0 && mc__hash_ranks(MC__FNV_OFFSET, members, m) == rec->hash) {
            mc__format_ranks(list, sizeof list, members, m, m);
            snprintf(buf, cap, "#%d %s[%d] = %s", number, mc__kinds[rec->kind].name,
                     (int)rec->index, list);
            return;
        }
    }
    snprintf(buf, cap, "#%d %s[%d] = (members hash %016llx)", number,
             mc__kind_valid(rec->kind) ? mc__kinds[rec->kind].name : "?", (int)rec->index,
             (unsigned long long)rec->hash);
}

/* Second round after a fingerprint mismatch: find and name the first differing entry. */
static int mc__plan_report_mismatch(mc_comm *world, const mc_grid *grid,
                                    const mc__plan_summary *all) {
    const mc__plan_summary *me = &all[world->rank];
    mc__plan_record *mine = NULL, *records = NULL;
    mc_plan_entry *plan = NULL;
    int *members = NULL;
    int padded = 0, i, b, rc, best_b = -1, best_i = INT_MAX;
    char sa[160], sb[160], ea[300], eb[300];
    for (i = 0; i < world->size; i++)
        if (all[i].n_entries > padded) padded = all[i].n_entries;
    mine = (mc__plan_record *)mc_calloc((size_t)padded, sizeof(mc__plan_record));
    records = (mc__plan_record *)mc_calloc((size_t)padded * (size_t)world->size,
                                           sizeof(mc__plan_record));
    plan = (mc_plan_entry *)mc_calloc((size_t)me->n_entries, sizeof(mc_plan_entry));
    members = (int *)mc_calloc((size_t)grid->desc.world, sizeof(int));
    if (!mine || !records || !plan || !members) {
        mc_free(mine);
        mc_free(records);
        mc_free(plan);
        mc_free(members);
        return MC__FAIL(MC_ERR_NO_MEMORY, "mc_parallel_check_plan: out of memory");
    }
    mc_grid_creation_plan(grid, plan, me->n_entries);
    mc__plan_records(grid, plan, me->n_entries, padded, members, mine);
    rc = mc__host_allgather(world, mine, records, (int)(sizeof(mc__plan_record) * (size_t)padded),
                            "group plan check (entries)");
    if (rc != MC_OK) return rc;   /* buffers leaked on purpose: MPI may still write them */
    for (b = 0; b < world->size; b++) {
        const mc__plan_record *theirs = records + (size_t)b * (size_t)padded;
        if (b == world->rank) continue;
        for (i = 0; i < padded && i < best_i; i++) {
            if (theirs[i].kind != mine[i].kind || theirs[i].index != mine[i].index ||
                theirs[i].hash != mine[i].hash) {
                best_i = i;
                best_b = b;
                break;
            }
        }
    }
    mc__describe_summary(sa, sizeof sa, world->rank, me);
    if (best_b < 0) {
        for (b = 0; b < world->size && best_b < 0; b++)
            if (all[b].fingerprint != me->fingerprint) best_b = b;
        if (best_b < 0) best_b = world->rank;
        mc__describe_summary(sb, sizeof sb, best_b, &all[best_b]);
        rc = MC__FAIL(MC_ERR_PLAN_MISMATCH,
                      "group plan differs: every group is the same, but rank %d and rank %d "
                      "disagree on the plan fingerprint through %s (salt %llu vs %llu, version "
                      "0x%06x vs 0x%06x; %s; %s)",
                      world->rank, best_b, mc__summary_difference(me, &all[best_b]),
                      (unsigned long long)me->salt, (unsigned long long)all[best_b].salt,
                      (unsigned)me->version, (unsigned)all[best_b].version, sa, sb);
    } else {
        mc_grid other;
        int other_ok = mc__grid_from_summary(&all[best_b], &other) == MC_OK;
        mc__describe_summary(sb, sizeof sb, best_b, &all[best_b]);
        mc__describe_entry(ea, sizeof ea, best_i + 1, &mine[best_i], grid, members);
        mc__describe_entry(eb, sizeof eb, best_i + 1,
                           &records[(size_t)best_b * (size_t)padded + (size_t)best_i],
                           other_ok ? &other : NULL, members);
        rc = MC__FAIL(MC_ERR_PLAN_MISMATCH, "group plan differs: rank %d creates %s but rank %d "
                      "creates %s (%s; %s)",
                      world->rank, ea, best_b, eb, sa, sb);
    }
    mc_free(mine);
    mc_free(records);
    mc_free(plan);
    mc_free(members);
    return rc;
}

MC_API int mc_parallel_check_plan(mc_comm *world, const mc_grid *grid, uint64_t salt) {
    mc__plan_summary mine, *all;
    int rc, i, agree = 1;
    if ((rc = mc__check_comm(world, "mc_parallel_check_plan")) != MC_OK) return rc;
    if ((rc = mc__grid_check(grid, "mc_parallel_check_plan")) != MC_OK) return rc;
    if (grid->desc.world != world->size)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_parallel_check_plan: grid world (%d) must equal the size of %s (%d)",
                        grid->desc.world, world->name, world->size);
    mc__plan_summarize(grid, salt, &mine);
    all = (mc__plan_summary *)mc_calloc((size_t)world->size, sizeof(mc__plan_summary));
    if (!all) return MC__FAIL(MC_ERR_NO_MEMORY, "mc_parallel_check_plan: out of memory");
    rc = mc__host_allgather(world, &mine, all, (int)sizeof mine, "group plan check");
    if (rc != MC_OK) return rc;   /* `all` leaked on purpose: MPI may still write it */
    for (i = 0; i < world->size; i++)
        if (all[i].fingerprint != mine.fingerprint) agree = 0;
    rc = agree ? MC_OK : mc__plan_report_mismatch(world, grid, all);
    mc_free(all);
    return rc;
}

/* The kinds in creation order; destroy walks it backwards. */
static const mc_group_kind mc__kind_creation_order[MC_GROUP_COUNT] = {
    MC_GROUP_DP_CP,     MC_GROUP_DP,       MC_GROUP_CP,        MC_GROUP_MP,
    MC_GROUP_TP,        MC_GROUP_PP,       MC_GROUP_EMBEDDING, MC_GROUP_POSITION_EMBEDDING,
    MC_GROUP_TP_DP_CP,  MC_GROUP_TP_DP,    MC_GROUP_TP_CP,     MC_GROUP_EP,
    MC_GROUP_EXPERT_TP, MC_GROUP_TP_EP,    MC_GROUP_TP_EP_PP,  MC_GROUP_EXPERT_DP};

static void mc__parallel_release(mc_parallel_state *ps) {
    int i;
    for (i = MC_GROUP_COUNT - 1; i >= 0; i--) {
        mc_group_kind k = mc__kind_creation_order[i];
        mc_comm_destroy(ps->group[k]);
        ps->group[k] = NULL;
        ps->group_index[k] = -1;
    }
}

/* Creates every plan entry collectively over the world and keeps this rank's groups. */
static int mc__parallel_create_all(mc_parallel_state *ps) {
    mc_plan_entry *plan;
    int *members, n, i, rc = MC_OK;
    n = mc_grid_creation_plan(&ps->grid, NULL, 0);
    plan = (mc_plan_entry *)mc_calloc((size_t)n, sizeof(mc_plan_entry));
    members = (int *)mc_calloc((size_t)ps->grid.desc.world, sizeof(int));
    if (!plan || !members) {
        mc_free(plan);
        mc_free(members);
        return MC__FAIL(MC_ERR_NO_MEMORY, "mc_parallel_init: out of memory");
    }
    mc_grid_creation_plan(&ps->grid, plan, n);
    for (i = 0; i < n && rc == MC_OK; i++) {
        mc_comm *child = NULL;
        int m = mc__grid_members(&ps->grid, (int)plan[i].kind, plan[i].index, members);
        rc = mc_comm_create_group_ex(ps->world, members, m, 1, &child);
        if (rc != MC_OK) break;
        ps->n_created++;
        if (!child) continue;
        snprintf(child->name, sizeof child->name, "%s[%d]", mc__kinds[plan[i].kind].name,
                 plan[i].index);
        ps->group[plan[i].kind] = child;
        ps->group_index[plan[i].kind] = plan[i].index;
    }
    mc_free(plan);
    mc_free(members);
    return rc;
}

/* All-gathers a validity flag; *bad = the first rank whose grid was invalid, -1 if none. */
static int mc__parallel_first_invalid(mc_comm *world, int valid, int *bad) {
    int *flags = (int *)mc_calloc((size_t)world->size, sizeof(int)), i, rc;
    *bad = -1;
    if (!flags) return MC__FAIL(MC_ERR_NO_MEMORY, "mc_parallel_init: out of memory");
    rc = mc__host_allgather(world, &valid, flags, (int)sizeof valid, "grid validity check");
    if (rc != MC_OK) return rc;   /* `flags` leaked on purpose: MPI may still write it */
    for (i = 0; i < world->size && *bad < 0; i++)
        if (!flags[i]) *bad = i;
    mc_free(flags);
    return MC_OK;
}

MC_API int mc_parallel_init(mc_parallel_state *ps, const mc_parallel_desc *desc) {
    mc_grid_desc gd;
    mc_grid grid;
    int rc, i;
    if (!ps || !desc)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_parallel_init: ps and desc must be set");
    memset(ps, 0, sizeof *ps);   /* output only: never read what the caller's struct held */
    if ((rc = mc__check_comm(desc->world, "mc_parallel_init (mc_parallel_desc.world)")) != MC_OK)
        return rc;
    gd = desc->grid;
    if (gd.world == 0) gd.world = desc->world->size;
    if (gd.world != desc->world->size)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_parallel_desc.grid.world (%d) must equal the size of the world "
                        "communicator %s (%d)",
                        gd.world, desc->world->name, desc->world->size);
    rc = mc_grid_init(&grid, &gd);
    /* A rank whose sizes fail validation must not leave the others waiting in the plan
       exchange: every rank first learns whether all grids were valid. */
    if (!desc->skip_plan_check && desc->world->size > 1) {
        int bad = -1, xrc = mc__parallel_first_invalid(desc->world, rc == MC_OK, &bad);
        if (rc != MC_OK) return rc;
        if (xrc != MC_OK) return xrc;
        if (bad >= 0)
            return MC__FAIL(MC_ERR_PLAN_MISMATCH,
                            "group plan differs: rank %d rejected its parallel sizes (its own "
                            "error says which rule), so no rank creates groups",
                            bad);
    }
    if (rc != MC_OK) return rc;
    if (!desc->skip_plan_check &&
        (rc = mc_parallel_check_plan(desc->world, &grid, desc->plan_salt)) != MC_OK)
        return rc;
    ps->grid = grid;
    ps->world = desc->world;
    for (i = 0; i < MC_GROUP_COUNT; i++) ps->group_index[i] = -1;
    mc_grid_coords(&ps->grid, desc->world->rank, &ps->coords);
    ps->plan_fingerprint = mc_grid_plan_fingerprint(&ps->grid, desc->plan_salt);
    rc = mc__parallel_create_all(ps);
    if (rc != MC_OK) {
        mc__parallel_release(ps);
        memset(ps, 0, sizeof *ps);
        return rc;
    }
    ps->initialized = 1;
    return MC_OK;
}

MC_API int mc_parallel_destroy(mc_parallel_state *ps) {
    if (!ps || !ps->initialized)
        return MC__FAIL(MC_ERR_STATE, "mc_parallel_destroy: the parallel state is not initialized");
    mc__parallel_release(ps);
    ps->initialized = 0;
    return MC_OK;
}

MC_API mc_comm *mc_parallel_group(const mc_parallel_state *ps, mc_group_kind kind) {
    if (!ps || !ps->initialized || !mc__kind_valid((int)kind)) return NULL;
    return ps->group[kind];
}

MC_API int mc_parallel_rank(const mc_parallel_state *ps, mc_group_kind kind) {
    mc_comm *c = mc_parallel_group(ps, kind);
    return c ? c->rank : -1;
}

MC_API int mc_parallel_size(const mc_parallel_state *ps, mc_group_kind kind) {
    mc_comm *c = mc_parallel_group(ps, kind);
    return c ? c->size : 0;
}

MC_API int mc_parallel_is_first_stage(const mc_parallel_state *ps, int ignore_virtual) {
    if (!ps || !ps->initialized || ps->coords.pp != 0) return 0;
    if (!ignore_virtual && ps->grid.desc.vpp > 0) return ps->vp_stage == 0;
    return 1;
}

MC_API int mc_parallel_is_last_stage(const mc_parallel_state *ps, int ignore_virtual) {
    if (!ps || !ps->initialized || ps->coords.pp != ps->grid.desc.pp - 1) return 0;
    if (!ignore_virtual && ps->grid.desc.vpp > 0) return ps->vp_stage == ps->grid.desc.vpp - 1;
    return 1;
}

/* The first member counts only on its first virtual stage, the last only on its last one;
   any other member always counts (Megatron's is_rank_in_embedding_group). */
MC_API int mc_parallel_in_embedding_group(const mc_parallel_state *ps, int ignore_virtual) {
    mc_comm *emb = mc_parallel_group(ps, MC_GROUP_EMBEDDING);
    if (!emb) return 0;
    if (ignore_virtual) return 1;
    if (emb->rank == 0) return mc_parallel_is_first_stage(ps, 0);
    if (emb->rank == emb->size - 1) return mc_parallel_is_last_stage(ps, 0);
    return 1;
}

MC_API int mc_parallel_src_rank(const mc_parallel_state *ps, mc_group_kind kind) {
    mc_comm *c = mc_parallel_group(ps, kind);
    return c ? c->world_ranks[0] : -1;
}

/* =============================================================================================
   tensor_parallel (implementation) */

/* @tensor_parallel:implementation begin */
// ---------------------------------------------------------------------------------------------
// >>tensor_parallel

#include <math.h>

/* Fault flags (see >>core.faults): the model passes them to the layer it breaks. They are 0
   in ordinary builds, so the branches that test them compile away. */
#if defined(MC_FAULT_HOOKS)
#define MC__TP_FAULT_NO_REDUCE (1 << 28)         /* row forward: no reduction over TP */
#define MC__TP_FAULT_NO_DGRAD_REDUCE (1 << 29)   /* column backward: no reduction of dX */
#else
#define MC__TP_FAULT_NO_REDUCE 0
#define MC__TP_FAULT_NO_DGRAD_REDUCE 0
#endif

static int mc__tp_size(const mc_comm *tp) { return tp ? tp->size : 1; }
static int mc__tp_rank(const mc_comm *tp) { return tp ? tp->rank : 0; }

/* Element i of a dt array, for pointer arithmetic on untyped tensors. */
static void *mc__tp_at(const void *p, size_t i, mc_dtype dt) {
    return (char *)(uintptr_t)p + i * mc_dtype_size(dt);
}

static int mc__tp_check_ops(const char *fn, const mc_ops *ops, mc_dtype dt) {
    if (!ops) return MC__FAIL(MC_ERR_INVALID_ARG, "%s: ops is NULL (pass mc_ops_cpu())", fn);
    if (dt != MC_F32 && dt != MC_BF16)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: dtype (%d) must be MC_F32 or MC_BF16", fn,
                        (int)dt);
    return MC_OK;
}

/* Megatron's divide(): the last dimension must split evenly over the TP ranks. */
static int mc__tp_divide(const char *fn, const char *what, long long n, int tp_size) {
    if (n <= 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: %s (%lld) must be > 0", fn, what, n);
    if (n % tp_size != 0)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "%s: %s (%lld) is not divisible by tensor_model_parallel_size (%d) "
                        "(Megatron's divide: %lld is not divisible by %d)",
                        fn, what, n, tp_size, n, tp_size);
    return MC_OK;
}

/* The sequence-parallel split: Megatron's assert on the first dimension. */
static int mc__tp_first_dim(const char *fn, int S, int tp_size) {
    if (S <= 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: first dimension (S = %d) must be > 0", fn, S);
    if (S % tp_size != 0)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "%s: first dimension of the tensor (S = %d) should be divisible by "
                        "tensor parallel size (%d)",
                        fn, S, tp_size);
    return MC_OK;
}

static int mc__tp_positive(const char *fn, const char *what, long long n) {
    if (n <= 0) return MC__FAIL(MC_ERR_INVALID_ARG, "%s: %s (%lld) must be > 0", fn, what, n);
    return MC_OK;
}

/* A caller's scratch, or one allocated through the op table for the duration of a call. */
typedef struct mc__tp_scratch {
    void *base;
    int owned;
} mc__tp_scratch;

static int mc__tp_scratch_get(mc__tp_scratch *s, void *given, size_t bytes, const char *fn,
                              const mc_ops *ops) {
    s->base = given;
    s->owned = 0;
    if (given || bytes == 0) return MC_OK;
    if (mc_ops_alloc(ops, MC_MEMORY_ACTIVATIONS, &s->base, bytes) != MC_OK)
        return MC__FAIL(MC_ERR_NO_MEMORY, "%s: no memory for %zu bytes of scratch", fn, bytes);
    s->owned = 1;
    return MC_OK;
}

static void mc__tp_scratch_put(mc__tp_scratch *s, const mc_ops *ops) {
    if (s->owned) mc_ops_free(ops, s->base);
    s->base = NULL;
    s->owned = 0;
}

/* out = inp; nothing to do in place. */
static int mc__tp_copy(void *out, const void *inp, size_t n, mc_dtype dt, const mc_ops *ops) {
    return out != inp ? ops->copy(ops, out, inp, n, dt, dt) : MC_OK;
}

// The primitives every mapping is made of. All take the communicator's TP size > 1 as given.

/* out [n] = sum over TP of inp [n] (in place when out == inp). */
static int mc__tp_all_reduce(void *out, const void *inp, size_t n, mc_dtype dt, mc_comm *tp) {
    return mc_all_reduce(tp, inp, out, n, dt, MC_SUM);
}

/* out [N, D/TP] = columns r*D/TP .. of inp [N, D]: one strided copy. */
static int mc__tp_split_last(void *out, const void *inp, int N, int D, int tp_size, int tp_rank,
                             mc_dtype dt, const mc_ops *ops) {
    size_t es = mc_dtype_size(dt), Dl = (size_t)(D / tp_size);
    return ops->copy_2d(ops, out, Dl * es, mc__tp_at(inp, (size_t)tp_rank * Dl, dt),
                        (size_t)D * es, Dl * es, (size_t)N);
}

/* stacked [TP, N, D/TP] holds the shards of TP ranks one after the other; out [N, D] puts them
   side by side: out[i, t*D/TP + j] = stacked[t, i, j], one strided copy per rank's shard. */
static int mc__tp_rechunk_last(void *out, const void *stacked, int N, int D, int tp_size,
                               mc_dtype dt, const mc_ops *ops) {
    size_t es = mc_dtype_size(dt), Dl = (size_t)(D / tp_size);
    int t, rc = MC_OK;
    for (t = 0; t < tp_size && rc == MC_OK; t++)
        rc = ops->copy_2d(ops, mc__tp_at(out, (size_t)t * Dl, dt), (size_t)D * es,
                          mc__tp_at(stacked, (size_t)t * N * Dl, dt), Dl * es, Dl * es,
                          (size_t)N);
    return rc;
}

/* out [N, D] = the [N, D/TP] shards of every rank side by side; scratch [TP, N, D/TP]. */
static int mc__tp_gather_last(void *out, void *scratch, const void *inp, int N, int D,
                              mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    size_t shard = (size_t)N * (size_t)(D / tp->size);
    int rc = mc_all_gather(tp, inp, scratch, shard, dt);
    if (rc != MC_OK) return rc;
    return mc__tp_rechunk_last(out, scratch, N, D, tp->size, dt, ops);
}

/* out [N, D/TP] = sum over TP of this rank's columns of inp [N, D]: the column slices are
   stacked along a new first dim of scratch [TP, N, D/TP] (one strided copy each), which is
   then reduce-scattered. */
static int mc__tp_reduce_scatter_last(void *out, void *scratch, const void *inp, int N, int D,
                                      mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    size_t es = mc_dtype_size(dt), Dl = (size_t)(D / tp->size);
    int t, rc = MC_OK;
    for (t = 0; t < tp->size && rc == MC_OK; t++)
        rc = ops->copy_2d(ops, mc__tp_at(scratch, (size_t)t * N * Dl, dt), Dl * es,
                          mc__tp_at(inp, (size_t)t * Dl, dt), (size_t)D * es, Dl * es,
                          (size_t)N);
    if (rc != MC_OK) return rc;
    return mc_reduce_scatter(tp, scratch, out, (size_t)N * Dl, dt, MC_SUM);
}

/* Along the first dim a shard [S/TP, R] is contiguous: split is one copy, gather and
   reduce-scatter are one collective each. */
static int mc__tp_split_first(void *out, const void *inp, int S, size_t R, int tp_size,
                              int tp_rank, mc_dtype dt, const mc_ops *ops) {
    size_t shard = (size_t)(S / tp_size) * R;
    return ops->copy(ops, out, mc__tp_at(inp, (size_t)tp_rank * shard, dt), shard, dt, dt);
}

static int mc__tp_gather_first(void *out, const void *inp, int S, size_t R, mc_dtype dt,
                               mc_comm *tp) {
    return mc_all_gather(tp, inp, out, (size_t)(S / tp->size) * R, dt);
}

static int mc__tp_reduce_scatter_first(void *out, const void *inp, int S, size_t R, mc_dtype dt,
                                       mc_comm *tp) {
    return mc_reduce_scatter(tp, inp, out, (size_t)(S / tp->size) * R, dt, MC_SUM);
}

// The mappings (§2): checks, the identity at TP = 1, then one primitive.

static int mc__tp_map_elems(const char *fn, void *out, const void *inp, size_t n, int reduce,
                            mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    int rc = mc__tp_check_ops(fn, ops, dt);
    if (rc != MC_OK) return rc;
    if (!reduce || mc__tp_size(tp) == 1) return mc__tp_copy(out, inp, n, dt, ops);
    return mc__tp_all_reduce(out, inp, n, dt, tp);
}

MC_API int mc_copy_to_tp_region_forward(void *out, const void *inp, size_t n, mc_dtype dt,
                                        mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_elems("copy_to_tensor_model_parallel_region", out, inp, n, 0, dt, tp, ops);
}

MC_API int mc_copy_to_tp_region_backward(void *dinp, const void *dout, size_t n, mc_dtype dt,
                                         mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_elems("copy_to_tensor_model_parallel_region", dinp, dout, n, 1, dt, tp,
                            ops);
}

MC_API int mc_reduce_from_tp_region_forward(void *out, const void *inp, size_t n, mc_dtype dt,
                                            mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_elems("reduce_from_tensor_model_parallel_region", out, inp, n, 1, dt, tp,
                            ops);
}

MC_API int mc_reduce_from_tp_region_backward(void *dinp, const void *dout, size_t n, mc_dtype dt,
                                             mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_elems("reduce_from_tensor_model_parallel_region", dinp, dout, n, 0, dt, tp,
                            ops);
}

/* Last-dim mappings. kind: 0 split, 1 gather, 2 reduce-scatter. */
static int mc__tp_map_last(const char *fn, int kind, void *out, void *scratch, const void *inp,
                           int N, int D, mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    int tp_size = mc__tp_size(tp), rc;
    mc__tp_scratch s;
    if ((rc = mc__tp_check_ops(fn, ops, dt)) != MC_OK) return rc;
    if ((rc = mc__tp_positive(fn, "rows N", N)) != MC_OK) return rc;
    if ((rc = mc__tp_divide(fn, "last dimension", D, tp_size)) != MC_OK) return rc;
    if (tp_size == 1) return mc__tp_copy(out, inp, (size_t)N * (size_t)D, dt, ops);
    if (kind == 0) return mc__tp_split_last(out, inp, N, D, tp_size, tp->rank, dt, ops);
    if ((rc = mc__tp_scratch_get(&s, scratch, mc_dtype_bytes(dt, (size_t)N * (size_t)D), fn,
                                 ops)) != MC_OK)
        return rc;
    rc = kind == 1 ? mc__tp_gather_last(out, s.base, inp, N, D, dt, tp, ops)
                   : mc__tp_reduce_scatter_last(out, s.base, inp, N, D, dt, tp, ops);
    mc__tp_scratch_put(&s, ops);
    return rc;
}

MC_API int mc_scatter_to_tp_region_forward(void *out, const void *inp, int N, int D, mc_dtype dt,
                                           mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_last("scatter_to_tensor_model_parallel_region", 0, out, NULL, inp, N, D, dt,
                           tp, ops);
}

MC_API int mc_scatter_to_tp_region_backward(void *dinp, void *scratch, const void *dout, int N,
                                            int D, mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_last("scatter_to_tensor_model_parallel_region", 1, dinp, scratch, dout, N,
                           D, dt, tp, ops);
}

MC_API int mc_gather_from_tp_region_forward(void *out, void *scratch, const void *inp, int N,
                                            int D, mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_last("gather_from_tensor_model_parallel_region", 1, out, scratch, inp, N,
                           D, dt, tp, ops);
}

MC_API int mc_gather_from_tp_region_backward(void *dinp, const void *dout, int N, int D,
                                             mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_last("gather_from_tensor_model_parallel_region", 0, dinp, NULL, dout, N, D,
                           dt, tp, ops);
}

MC_API int mc_all_gather_last_dim_forward(void *out, void *scratch, const void *inp, int N, int D,
                                          mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_last("all_gather_last_dim_from_tensor_parallel_region", 1, out, scratch,
                           inp, N, D, dt, tp, ops);
}

MC_API int mc_all_gather_last_dim_backward(void *dinp, void *scratch, const void *dout, int N,
                                           int D, mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_last("all_gather_last_dim_from_tensor_parallel_region", 2, dinp, scratch,
                           dout, N, D, dt, tp, ops);
}

MC_API int mc_reduce_scatter_last_dim_forward(void *out, void *scratch, const void *inp, int N,
                                              int D, mc_dtype dt, mc_comm *tp,
                                              const mc_ops *ops) {
    return mc__tp_map_last("reduce_scatter_last_dim_to_tensor_parallel_region", 2, out, scratch,
                           inp, N, D, dt, tp, ops);
}

MC_API int mc_reduce_scatter_last_dim_backward(void *dinp, void *scratch, const void *dout,
                                               int N, int D, mc_dtype dt, mc_comm *tp,
                                               const mc_ops *ops) {
    return mc__tp_map_last("reduce_scatter_last_dim_to_tensor_parallel_region", 1, dinp, scratch,
                           dout, N, D, dt, tp, ops);
}

/* First-dim mappings. kind: 0 split, 1 gather, 2 reduce-scatter. */
static int mc__tp_map_first(const char *fn, int kind, void *out, const void *inp, int S,
                            size_t R, mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    int tp_size = mc__tp_size(tp), rc;
    if ((rc = mc__tp_check_ops(fn, ops, dt)) != MC_OK) return rc;
    if ((rc = mc__tp_first_dim(fn, S, tp_size)) != MC_OK) return rc;
    if (tp_size == 1) return mc__tp_copy(out, inp, (size_t)S * R, dt, ops);
    if (kind == 0) return mc__tp_split_first(out, inp, S, R, tp_size, tp->rank, dt, ops);
    return kind == 1 ? mc__tp_gather_first(out, inp, S, R, dt, tp)
                     : mc__tp_reduce_scatter_first(out, inp, S, R, dt, tp);
}

MC_API int mc_scatter_to_sp_region_forward(void *out, const void *inp, int S, size_t R,
                                           mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_first("scatter_to_sequence_parallel_region", 0, out, inp, S, R, dt, tp,
                            ops);
}

MC_API int mc_scatter_to_sp_region_backward(void *dinp, const void *dout, int S, size_t R,
                                            mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_first("scatter_to_sequence_parallel_region", 1, dinp, dout, S, R, dt, tp,
                            ops);
}

MC_API int mc_gather_from_sp_region_forward(void *out, const void *inp, int S, size_t R,
                                            mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_first("gather_from_sequence_parallel_region", 1, out, inp, S, R, dt, tp,
                            ops);
}

MC_API int mc_gather_from_sp_region_backward(void *dinp, const void *dout, int S, size_t R,
                                             int tensor_parallel_output_grad, mc_dtype dt,
                                             mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_first("gather_from_sequence_parallel_region",
                            tensor_parallel_output_grad ? 2 : 0, dinp, dout, S, R, dt, tp, ops);
}

MC_API int mc_reduce_scatter_to_sp_region_forward(void *out, const void *inp, int S, size_t R,
                                                  mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_first("reduce_scatter_to_sequence_parallel_region", 2, out, inp, S, R, dt,
                            tp, ops);
}

MC_API int mc_reduce_scatter_to_sp_region_backward(void *dinp, const void *dout, int S, size_t R,
                                                   mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    return mc__tp_map_first("reduce_scatter_to_sequence_parallel_region", 1, dinp, dout, S, R,
                            dt, tp, ops);
}

// Column / Row parallel linear (§3).
//
// GEMM shapes, with N = S * B tokens (ops->gemm: C[M,N] = op(A) op(B)):
//   Y  [N, OUT] = X [N, IN] W^T + b   W stored [OUT, IN]    gemm(Y, X, W, b, N, OUT, IN, 0, 1)
//   dX [N, IN]  = dY [N, OUT] W                             gemm(dX, dY, W, -, N, IN, OUT, 0, 0)
//   dW [OUT, IN] += dY^T X    (fp32)                        gemm(dW, dY, X, -, OUT, IN, N, 1, 0)

static int mc__tp_linear_fwd(void *y, const void *x, const void *w, const void *b, int N, int IN,
                             int OUT, mc_dtype dt, const mc_ops *ops) {
    return ops->gemm(ops, y, x, w, b, N, OUT, IN, 0, 1, 1.0f, 0.0f, dt, dt);
}

/* out [rows, OC] += bias: a GEMM with K = 0 is beta * C + bias, the table's epilogue alone. */
static int mc__tp_add_bias(void *out, const void *bias, int rows, int OC, mc_dtype dt,
                           const mc_ops *ops) {
    return ops->gemm(ops, out, NULL, NULL, bias, rows, OC, 0, 0, 0, 1.0f, 1.0f, dt, dt);
}

static int mc__tp_linear_dgrad(void *dx, const void *dy, const void *w, int N, int IN, int OUT,
                               mc_dtype dt, const mc_ops *ops) {
    return ops->gemm(ops, dx, dy, w, NULL, N, IN, OUT, 0, 0, 1.0f, 0.0f, dt, dt);
}

static int mc__tp_linear_wgrad(float *dw, float *db, const void *dy, const void *x, int N,
                               int IN, int OUT, mc_dtype dt, const mc_ops *ops) {
    int rc = ops->gemm(ops, dw, dy, x, NULL, OUT, IN, N, 1, 0, 1.0f, 1.0f, MC_F32, dt);
    if (rc == MC_OK && db) rc = ops->bias_backward(ops, db, dy, N, OUT, dt);
    return rc;
}

/* Common checks of both linear layers; *sp receives whether SP is in effect (TP > 1). */
static int mc__tp_linear_check(const char *fn, int is_row, int S, int B, int C, int OC,
                               int flags, mc_dtype dt, mc_comm *tp, const mc_ops *ops, int *sp) {
    int tp_size = mc__tp_size(tp), rc;
    if ((rc = mc__tp_check_ops(fn, ops, dt)) != MC_OK) return rc;
    if ((rc = mc__tp_positive(fn, "S", S)) != MC_OK) return rc;
    if ((rc = mc__tp_positive(fn, "B", B)) != MC_OK) return rc;
    if (is_row) {
        if ((rc = mc__tp_positive(fn, "output_size", OC)) != MC_OK) return rc;
        if ((rc = mc__tp_divide(fn, "input_size", C, tp_size)) != MC_OK) return rc;
        if ((flags & MC_TP_SEQUENCE_PARALLEL) && !(flags & MC_TP_INPUT_IS_PARALLEL))
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "%s: flags has MC_TP_SEQUENCE_PARALLEL without "
                            "MC_TP_INPUT_IS_PARALLEL (Megatron: To enable `sequence_parallel`, "
                            "`input_is_parallel` must be `True`)",
                            fn);
        if (flags & MC_TP_GATHER_OUTPUT)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "%s: MC_TP_GATHER_OUTPUT is a column-parallel option", fn);
    } else {
        if ((rc = mc__tp_positive(fn, "input_size", C)) != MC_OK) return rc;
        if ((rc = mc__tp_divide(fn, "output_size", OC, tp_size)) != MC_OK) return rc;
        if ((flags & MC_TP_SEQUENCE_PARALLEL) && (flags & MC_TP_GATHER_OUTPUT))
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "%s: MC_TP_GATHER_OUTPUT with MC_TP_SEQUENCE_PARALLEL (Megatron "
                            "asserts not sequence_parallel when gather_output)",
                            fn);
        if (flags & MC_TP_INPUT_IS_PARALLEL)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "%s: MC_TP_INPUT_IS_PARALLEL is a row-parallel option", fn);
    }
    *sp = (flags & MC_TP_SEQUENCE_PARALLEL) && tp_size > 1;
    if (*sp && (rc = mc__tp_first_dim(fn, S, tp_size)) != MC_OK) return rc;
    return MC_OK;
}

/* Column scratch, forward:  [S, B, C] gathered input (SP) | [N, OC/TP] local output and
   [TP, N, OC/TP] gather buffer (gather_output). Backward: [N, OC/TP] split dY
   (gather_output) | [S, B, C] re-gathered input and [S, B, C] full dX (SP). */
MC_API size_t mc_column_parallel_linear_scratch(int S, int B, int C, int OC, int flags,
                                                int tp_size) {
    size_t N = (size_t)S * (size_t)B, fwd = 0, bwd = 0;
    int sp = (flags & MC_TP_SEQUENCE_PARALLEL) && tp_size > 1;
    int gather = (flags & MC_TP_GATHER_OUTPUT) && tp_size > 1;
    if (S <= 0 || B <= 0 || C <= 0 || OC <= 0 || tp_size <= 0) return 0;
    if (sp) {
        fwd += N * (size_t)C;
        bwd += 2 * N * (size_t)C;
    }
    if (gather) {
        fwd += N * (size_t)(OC / tp_size) + N * (size_t)OC;
        bwd += N * (size_t)(OC / tp_size);
    }
    return fwd > bwd ? fwd : bwd;
}

/* Y = X A^T + b and the GEMM beside it; with pre != NULL the MLP's fc1 -> GELU: pre = Y and
   y = gelu(Y) from one fused op. */
static int mc__tp_linear_fwd_act(void *y, void *pre, const void *x, const void *w, const void *b,
                                 int N, int IN, int OUT, mc_dtype dt, const mc_ops *ops) {
    int rc;
    if (!pre) return mc__tp_linear_fwd(y, x, w, b, N, IN, OUT, dt, ops);
    if (ops->gemm_gelu_forward)
        return ops->gemm_gelu_forward(ops, y, pre, x, w, b, N, OUT, IN, 0, 1, dt);
    rc = mc__tp_linear_fwd(pre, x, w, b, N, IN, OUT, dt, ops);   /* a table without the op */
    return rc == MC_OK ? ops->gelu_forward(ops, y, pre, (size_t)N * (size_t)OUT, dt) : rc;
}

/* dX = dY A; with pre != NULL (the input was gelu(pre)) dX = gelu'(pre) * dY A, fused. */
static int mc__tp_linear_dgrad_act(void *dx, const void *pre, const void *dy, const void *w,
                                   int N, int IN, int OUT, mc_dtype dt, const mc_ops *ops) {
    int rc;
    if (!pre) return mc__tp_linear_dgrad(dx, dy, w, N, IN, OUT, dt, ops);
    if (ops->gemm_gelu_backward)
        return ops->gemm_gelu_backward(ops, dx, pre, dy, w, N, IN, OUT, 0, 0, dt);
    rc = mc__tp_linear_dgrad(dx, dy, w, N, IN, OUT, dt, ops);
    return rc == MC_OK ? ops->gelu_backward(ops, dx, pre, dx, (size_t)N * (size_t)IN, dt) : rc;
}

static int mc__tp_column_forward(const char *fn, void *out, void *pre, void *scratch,
                                 const void *inp, const void *weight, const void *bias, int S,
                                 int B, int C, int OC, int flags, mc_dtype dt, mc_comm *tp,
                                 const mc_ops *ops) {
    int sp, rc, tp_size = mc__tp_size(tp);
    int gather = (flags & MC_TP_GATHER_OUTPUT) && tp_size > 1;
    int N = S * B, OCl;
    const void *x = inp;
    void *y = out;
    char *next;
    mc__tp_scratch s;
    if ((rc = mc__tp_linear_check(fn, 0, S, B, C, OC, flags, dt, tp, ops, &sp)) != MC_OK)
        return rc;
    OCl = OC / tp_size;
    if ((rc = mc__tp_scratch_get(&s, scratch,
                                 mc_dtype_bytes(dt, mc_column_parallel_linear_scratch(
                                                        S, B, C, OC, flags, tp_size)),
                                 fn, ops)) != MC_OK)
        return rc;
    next = (char *)s.base;
    if (sp) {   /* [S/TP, B, C] -> [S, B, C]: every rank multiplies the whole sequence */
        if ((rc = mc__tp_gather_first(next, inp, S, (size_t)B * C, dt, tp)) != MC_OK) goto done;
        x = next;
        next += mc_dtype_bytes(dt, (size_t)N * C);
    }
    if (gather) {   /* the local [N, OC/TP] first, then [TP, N, OC/TP] -> out [N, OC] */
        y = next;
        next += mc_dtype_bytes(dt, (size_t)N * OCl);
    }
    rc = mc__tp_linear_fwd_act(y, pre, x, weight, (flags & MC_TP_SKIP_BIAS_ADD) ? NULL : bias, N,
                               C, OCl, dt, ops);
    if (rc == MC_OK && gather) rc = mc__tp_gather_last(out, next, y, N, OC, dt, tp, ops);
done:
    mc__tp_scratch_put(&s, ops);
    return rc;
}

MC_API int mc_column_parallel_linear_forward(void *out, void *scratch, const void *inp,
                                             const void *weight, const void *bias, int S, int B,
                                             int C, int OC, int flags, mc_dtype dt, mc_comm *tp,
                                             const mc_ops *ops) {
    return mc__tp_column_forward("column_parallel_linear_forward", out, NULL, scratch, inp,
                                 weight, bias, S, B, C, OC, flags, dt, tp, ops);
}

MC_API int mc_column_parallel_linear_gelu_forward(void *out, void *pre, void *scratch,
                                                  const void *inp, const void *weight,
                                                  const void *bias, int S, int B, int C, int OC,
                                                  int flags, mc_dtype dt, mc_comm *tp,
                                                  const mc_ops *ops) {
    static const char fn[] = "column_parallel_linear_gelu_forward";
    if (!out || !pre || out == pre)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: out (%p) and pre (%p) must be two buffers", fn,
                        out, pre);
    if (flags & (MC_TP_GATHER_OUTPUT | MC_TP_SKIP_BIAS_ADD))
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: flags (%d) must not hold MC_TP_GATHER_OUTPUT or "
                        "MC_TP_SKIP_BIAS_ADD (the GELU takes this rank's columns, bias added)",
                        fn, flags);
    return mc__tp_column_forward(fn, out, pre, scratch, inp, weight, bias, S, B, C, OC, flags, dt,
                                 tp, ops);
}

MC_API int mc_column_parallel_linear_backward(void *dinp, float *dweight, float *dbias,
                                              void *scratch, const void *dout, const void *inp,
                                              const void *weight, int S, int B, int C, int OC,
                                              int flags, mc_dtype dt, mc_comm *tp,
                                              const mc_ops *ops) {
    static const char fn[] = "column_parallel_linear_backward";
    int sp, rc, tp_size = mc__tp_size(tp);
    int gather = (flags & MC_TP_GATHER_OUTPUT) && tp_size > 1;
    int N = S * B, OCl;
    const void *dy = dout;
    char *next;
    float *db = (flags & MC_TP_SKIP_BIAS_ADD) ? NULL : dbias;
    mc_request *req = NULL;
    mc__tp_scratch s;
    if ((rc = mc__tp_linear_check(fn, 0, S, B, C, OC, flags, dt, tp, ops, &sp)) != MC_OK)
        return rc;
    OCl = OC / tp_size;
    if ((rc = mc__tp_scratch_get(&s, scratch,
                                 mc_dtype_bytes(dt, mc_column_parallel_linear_scratch(
                                                        S, B, C, OC, flags, tp_size)),
                                 fn, ops)) != MC_OK)
        return rc;
    next = (char *)s.base;
    if (gather) {   /* the gather's backward: keep this rank's columns of dY [N, OC] */
        if ((rc = mc__tp_split_last(next, dout, N, OC, tp_size, tp->rank, dt, ops)) != MC_OK)
            goto done;
        dy = next;
        next += mc_dtype_bytes(dt, (size_t)N * OCl);
    }
    if (sp) {
        /* The forward did not keep the gathered input: gather it again while dX = dY A runs,
           then reduce-scatter dX along S while dA = dY^T X runs. */
        void *x_full = next, *dx_full = next + mc_dtype_bytes(dt, (size_t)N * C);
        rc = mc_all_gather_async(tp, inp, x_full, (size_t)(S / tp_size) * B * C, dt, &req);
        if (rc != MC_OK) goto done;
        rc = mc__tp_linear_dgrad(dx_full, dy, weight, N, C, OCl, dt, ops);
        if (rc != MC_OK) {
            mc_wait(req);
            goto done;
        }
        if ((rc = mc_wait(req)) != MC_OK) goto done;
        req = NULL;
        if (flags & MC__TP_FAULT_NO_DGRAD_REDUCE)   /* this rank's rows, not reduced */
            rc = mc__tp_split_first(dinp, dx_full, S, (size_t)B * C, tp_size, tp->rank, dt, ops);
        else
            rc = mc_reduce_scatter_async(tp, dx_full, dinp, (size_t)(S / tp_size) * B * C, dt,
                                         MC_SUM, &req);
        if (rc != MC_OK) goto done;
        rc = mc__tp_linear_wgrad(dweight, db, dy, x_full, N, C, OCl, dt, ops);
        if (req) {
            int wrc = mc_wait(req);
            if (rc == MC_OK) rc = wrc;
        }
        goto done;
    }
    if ((rc = mc__tp_linear_dgrad(dinp, dy, weight, N, C, OCl, dt, ops)) != MC_OK) goto done;
    if (tp_size > 1 && !(flags & MC__TP_FAULT_NO_DGRAD_REDUCE)) {
        /* Every rank holds a partial dX (its OC/TP outputs' share): sum it over TP while the
           weight gradient is computed, the overlap Megatron's allreduce_dgrad exists for. */
        rc = mc_all_reduce_async(tp, dinp, dinp, (size_t)N * C, dt, MC_SUM, &req);
        if (rc != MC_OK) goto done;
    }
    rc = mc__tp_linear_wgrad(dweight, db, dy, inp, N, C, OCl, dt, ops);
    if (req) {
        int wrc = mc_wait(req);
        if (rc == MC_OK) rc = wrc;
    }
done:
    mc__tp_scratch_put(&s, ops);
    return rc;
}

/* Row scratch, forward: [N, C/TP] split input (input not parallel) | [S, B, OC] partial output
   before the reduce-scatter (SP). Backward: [S, B, OC] gathered dY (SP) | [N, C/TP] split
   input, [N, C/TP] local dX and [TP, N, C/TP] gather buffer (input not parallel). */
MC_API size_t mc_row_parallel_linear_scratch(int S, int B, int C, int OC, int flags,
                                             int tp_size) {
    size_t N = (size_t)S * (size_t)B, fwd = 0, bwd = 0;
    int sp = (flags & MC_TP_SEQUENCE_PARALLEL) && tp_size > 1;
    int split = !(flags & MC_TP_INPUT_IS_PARALLEL) && tp_size > 1;
    if (S <= 0 || B <= 0 || C <= 0 || OC <= 0 || tp_size <= 0) return 0;
    if (split) {
        fwd += N * (size_t)(C / tp_size);
        bwd += 2 * N * (size_t)(C / tp_size) + N * (size_t)C;
    }
    if (sp) {
        fwd += N * (size_t)OC;
        bwd += N * (size_t)OC;
    }
    return fwd > bwd ? fwd : bwd;
}

MC_API int mc_row_parallel_linear_forward(void *out, void *scratch, const void *inp,
                                          const void *weight, const void *bias, int S, int B,
                                          int C, int OC, int flags, mc_dtype dt, mc_comm *tp,
                                          const mc_ops *ops) {
    static const char fn[] = "row_parallel_linear_forward";
    int sp, rc, tp_size = mc__tp_size(tp);
    int split = !(flags & MC_TP_INPUT_IS_PARALLEL) && tp_size > 1;
    int N = S * B, Cl;
    const void *x = inp;
    const void *b = (flags & MC_TP_SKIP_BIAS_ADD) ? NULL : bias;
    char *next;
    mc__tp_scratch s;
    if ((rc = mc__tp_linear_check(fn, 1, S, B, C, OC, flags, dt, tp, ops, &sp)) != MC_OK)
        return rc;
    Cl = C / tp_size;
    if ((rc = mc__tp_scratch_get(&s, scratch,
                                 mc_dtype_bytes(dt, mc_row_parallel_linear_scratch(
                                                        S, B, C, OC, flags, tp_size)),
                                 fn, ops)) != MC_OK)
        return rc;
    next = (char *)s.base;
    if (split) {   /* scatter_to_tensor_model_parallel_region: keep this rank's C/TP columns */
        if ((rc = mc__tp_split_last(next, inp, N, C, tp_size, tp->rank, dt, ops)) != MC_OK)
            goto done;
        x = next;
        next += mc_dtype_bytes(dt, (size_t)N * Cl);
    }
    if (sp) {   /* partial [S, B, OC] -> summed [S/TP, B, OC] */
        rc = mc__tp_linear_fwd(next, x, weight, NULL, N, Cl, OC, dt, ops);
        if (rc == MC_OK && (flags & MC__TP_FAULT_NO_REDUCE))   /* this rank's rows, not summed */
            rc = mc__tp_split_first(out, next, S, (size_t)B * OC, tp_size, tp->rank, dt, ops);
        else if (rc == MC_OK)
            rc = mc__tp_reduce_scatter_first(out, next, S, (size_t)B * OC, dt, tp);
        /* After the reduction, so that the replicated bias is counted once, not TP times. */
        if (rc == MC_OK && b) rc = mc__tp_add_bias(out, b, N / tp_size, OC, dt, ops);
    } else if (tp_size > 1) {   /* partial [S, B, OC] -> summed in place, then the bias */
        rc = mc__tp_linear_fwd(out, x, weight, NULL, N, Cl, OC, dt, ops);
        if (rc == MC_OK && !(flags & MC__TP_FAULT_NO_REDUCE))
            rc = mc__tp_all_reduce(out, out, (size_t)N * OC, dt, tp);
        if (rc == MC_OK && b) rc = mc__tp_add_bias(out, b, N, OC, dt, ops);
    } else {   /* one rank: the bias rides in the GEMM's epilogue */
        rc = mc__tp_linear_fwd(out, x, weight, b, N, Cl, OC, dt, ops);
    }
done:
    mc__tp_scratch_put(&s, ops);
    return rc;
}

static int mc__tp_row_backward(const char *fn, void *dinp, float *dweight, float *dbias,
                               void *scratch, const void *dout, const void *inp, const void *pre,
                               const void *weight, int S, int B, int C, int OC, int flags,
                               mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    int sp, rc, tp_size = mc__tp_size(tp);
    int split = !(flags & MC_TP_INPUT_IS_PARALLEL) && tp_size > 1;
    int N = S * B, Cl;
    const void *x = inp, *dy = dout;
    char *next;
    void *dx = dinp;
    mc_request *req = NULL;
    mc__tp_scratch s;
    if ((rc = mc__tp_linear_check(fn, 1, S, B, C, OC, flags, dt, tp, ops, &sp)) != MC_OK)
        return rc;
    Cl = C / tp_size;
    if ((rc = mc__tp_scratch_get(&s, scratch,
                                 mc_dtype_bytes(dt, mc_row_parallel_linear_scratch(
                                                        S, B, C, OC, flags, tp_size)),
                                 fn, ops)) != MC_OK)
        return rc;
    next = (char *)s.base;
    /* The bias was added to this rank's rows of the output: its gradient is the sum of those
       rows of dY (under SP a partial sum, completed by the TP all-reduce in finalize). */
    if (dbias && !(flags & MC_TP_SKIP_BIAS_ADD) &&
        (rc = ops->bias_backward(ops, dbias, dout, sp ? N / tp_size : N, OC, dt)) != MC_OK)
        goto done;
    if (sp) {   /* the reduce-scatter's backward: all-gather dY along S */
        if ((rc = mc__tp_gather_first(next, dout, S, (size_t)B * OC, dt, tp)) != MC_OK) goto done;
        dy = next;
        next += mc_dtype_bytes(dt, (size_t)N * OC);
    }
    if (split) {   /* the forward's split input (recomputed) and a local dX to gather later */
        if ((rc = mc__tp_split_last(next, inp, N, C, tp_size, tp->rank, dt, ops)) != MC_OK)
            goto done;
        x = next;
        dx = next + mc_dtype_bytes(dt, (size_t)N * Cl);
        next += 2 * mc_dtype_bytes(dt, (size_t)N * Cl);
    }
    /* pre only with the input parallel (checked by the caller): dx is dinp, nothing split */
    if ((rc = mc__tp_linear_dgrad_act(dx, pre, dy, weight, N, Cl, OC, dt, ops)) != MC_OK)
        goto done;
    if (split) {   /* the split's backward: all-gather dX [N, C/TP] while dA runs */
        rc = mc_all_gather_async(tp, dx, next, (size_t)N * Cl, dt, &req);
        if (rc != MC_OK) goto done;
    }
    rc = mc__tp_linear_wgrad(dweight, NULL, dy, x, N, Cl, OC, dt, ops);
    if (split) {
        int wrc = mc_wait(req);
        if (rc == MC_OK) rc = wrc;
        if (rc == MC_OK) rc = mc__tp_rechunk_last(dinp, next, N, C, tp_size, dt, ops);
    }
done:
    mc__tp_scratch_put(&s, ops);
    return rc;
}

MC_API int mc_row_parallel_linear_backward(void *dinp, float *dweight, float *dbias,
                                           void *scratch, const void *dout, const void *inp,
                                           const void *weight, int S, int B, int C, int OC,
                                           int flags, mc_dtype dt, mc_comm *tp,
                                           const mc_ops *ops) {
    return mc__tp_row_backward("row_parallel_linear_backward", dinp, dweight, dbias, scratch,
                               dout, inp, NULL, weight, S, B, C, OC, flags, dt, tp, ops);
}

MC_API int mc_row_parallel_linear_gelu_backward(void *dpre, float *dweight, float *dbias,
                                                void *scratch, const void *dout, const void *inp,
                                                const void *pre, const void *weight, int S,
                                                int B, int C, int OC, int flags, mc_dtype dt,
                                                mc_comm *tp, const mc_ops *ops) {
    static const char fn[] = "row_parallel_linear_gelu_backward";
    if (!dpre || !pre || dpre == pre)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: dpre (%p) and pre (%p) must be two buffers", fn,
                        dpre, pre);
    if (!(flags & MC_TP_INPUT_IS_PARALLEL))
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: flags (%d) must hold MC_TP_INPUT_IS_PARALLEL "
                        "(the GELU's output is this rank's slice of the input)", fn, flags);
    return mc__tp_row_backward(fn, dpre, dweight, dbias, scratch, dout, inp, pre, weight, S, B, C,
                               OC, flags, dt, tp, ops);
}

// Vocab-parallel embedding and cross entropy (§4, §5).

MC_API int mc_vocab_range(int V, int tp_rank, int tp_size, int *start, int *end) {
    static const char fn[] = "vocab_range";
    int rc;
    if (tp_size <= 0 || tp_rank < 0 || tp_rank >= tp_size)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: tp_rank (%d) is not in [0, tp_size = %d)", fn,
                        tp_rank, tp_size);
    if ((rc = mc__tp_divide(fn, "vocabulary size", V, tp_size)) != MC_OK) return rc;
    if (start) *start = tp_rank * (V / tp_size);
    if (end) *end = (tp_rank + 1) * (V / tp_size);
    return MC_OK;
}

static int mc__tp_embedding_check(const char *fn, const int *ids, int N, int C, int V,
                                  mc_dtype dt, mc_comm *tp, const mc_ops *ops, int *start,
                                  int *end) {
    int rc;
    if ((rc = mc__tp_check_ops(fn, ops, dt)) != MC_OK) return rc;
    if ((rc = mc__tp_positive(fn, "tokens N", N)) != MC_OK) return rc;
    if ((rc = mc__tp_positive(fn, "embedding_dim C", C)) != MC_OK) return rc;
    if ((rc = mc__tp_divide(fn, "num_embeddings (padded vocabulary)", V, mc__tp_size(tp))) !=
        MC_OK)
        return rc;
    if ((rc = ops->check_ids(ops, ids, N, V, fn, "ids")) != MC_OK) return rc;
    return mc_vocab_range(V, mc__tp_rank(tp), mc__tp_size(tp), start, end);
}

MC_API int mc_vocab_parallel_embedding_forward(void *out, const int *ids, const void *table,
                                               int N, int C, int V, mc_dtype dt, mc_comm *tp,
                                               const mc_ops *ops) {
    static const char fn[] = "vocab_parallel_embedding_forward";
    int start = 0, end = 0, rc;
    if ((rc = mc__tp_embedding_check(fn, ids, N, C, V, dt, tp, ops, &start, &end)) != MC_OK)
        return rc;
    /* Ids outside [start, end) give zero rows, so the sum over TP is the full lookup. */
    if ((rc = ops->embedding_forward(ops, out, ids, table, N, C, start, end, dt)) != MC_OK)
        return rc;
    if (mc__tp_size(tp) == 1) return MC_OK;
    return mc__tp_all_reduce(out, out, (size_t)N * C, dt, tp);
}

MC_API int mc_vocab_parallel_embedding_backward(float *dtable, const void *dout, const int *ids,
                                                int N, int C, int V, mc_dtype dt, mc_comm *tp,
                                                const mc_ops *ops) {
    static const char fn[] = "vocab_parallel_embedding_backward";
    int start = 0, end = 0, rc;
    if ((rc = mc__tp_embedding_check(fn, ids, N, C, V, dt, tp, ops, &start, &end)) != MC_OK)
        return rc;
    return ops->embedding_backward(ops, dtable, dout, ids, N, C, start, end, dt);
}

MC_API size_t mc_vocab_parallel_cross_entropy_scratch(int N, int V, float label_smoothing,
                                                      int tp_size) {
    if (N <= 0 || V <= 0 || tp_size <= 0) return 0;
    /* target logits [N]; with smoothing also [sum_exp | sum of logits] [2N] */
    return label_smoothing > 0.0f ? 3 * (size_t)N : (size_t)N;
}

static int mc__tp_ce_check(const char *fn, const int *targets, int N, int V,
                           float label_smoothing, mc_dtype dt, mc_comm *tp, const mc_ops *ops) {
    int rc;
    if ((rc = mc__tp_check_ops(fn, ops, dt)) != MC_OK) return rc;
    if ((rc = mc__tp_positive(fn, "tokens N", N)) != MC_OK) return rc;
    if ((rc = mc__tp_divide(fn, "vocabulary size V", V, mc__tp_size(tp))) != MC_OK) return rc;
    if (!(label_smoothing >= 0.0f && label_smoothing < 1.0f))
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: label_smoothing (%g) must be in [0, 1)", fn,
                        (double)label_smoothing);
    if (label_smoothing > 0.0f && V < 2)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "%s: label smoothing needs a vocabulary of at least 2 (V = %d)", fn, V);
    return ops->check_ids(ops, targets, N, V, fn, "targets");
}

/* Megatron's label_smoothing a as the weight s of the uniform part: the target gets 1 - a and
   each of the K - 1 others a / (K - 1), i.e. (1 - s) onehot + s / K with s = a K / (K - 1). */
/* The reduction of the cross entropy's row-max (MC_MAX) or sum-of-exp (MC_SUM) all-reduce;
   a CE fault swaps one of them (>>core.faults). */
static mc_reduce_op mc__ce_reduce_op(mc_reduce_op op) {
#if defined(MC_FAULT_HOOKS)
    if (op == MC_MAX && mc__fault.kind == MC_FAULT_CE_MAX_SUM) return MC_SUM;
    if (op == MC_SUM && mc__fault.kind == MC_FAULT_CE_SUM_EXP_MAX) return MC_MAX;
#endif
    return op;
}

static float mc__tp_smoothing_s(float label_smoothing, int K) {
    if (label_smoothing <= 0.0f) return 0.0f;
    return (float)((double)label_smoothing * K / (K - 1.0));
}

MC_API int mc_vocab_parallel_cross_entropy_forward(float *losses, double *loss_sum, float *max,
                                                   float *sum_exp, float *scratch,
                                                   const void *logits, const int *targets, int N,
                                                   int V, float label_smoothing, mc_dtype dt,
                                                   mc_comm *tp, const mc_ops *ops) {
    static const char fn[] = "vocab_parallel_cross_entropy_forward";
    int tp_size = mc__tp_size(tp), rc, Vl, start;
    int smoothing = label_smoothing > 0.0f;
    float *target_logit, *packed = NULL;
    mc__tp_scratch s;
    if ((rc = mc__tp_ce_check(fn, targets, N, V, label_smoothing, dt, tp, ops)) != MC_OK)
        return rc;
    Vl = V / tp_size;
    start = mc__tp_rank(tp) * Vl;
    if ((rc = mc__tp_scratch_get(
             &s, scratch,
             sizeof(float) * mc_vocab_parallel_cross_entropy_scratch(N, V, label_smoothing,
                                                                     tp_size),
             fn, ops)) != MC_OK)
        return rc;
    target_logit = (float *)s.base;

    /* 1. The global row maximum, so that no rank's exp overflows. */
    if ((rc = ops->row_max(ops, max, logits, N, Vl, dt)) != MC_OK) goto done;
    if (tp_size > 1 && (rc = mc_all_reduce(tp, max, max, (size_t)N, MC_F32,
                                           mc__ce_reduce_op(MC_MAX))) != MC_OK)
        goto done;
    /* 2. The target logit: only its owner contributes, the others add 0. */
    if ((rc = ops->target_logit(ops, target_logit, logits, targets, N, Vl, start, dt)) != MC_OK)
        goto done;
    if (tp_size > 1 &&
        (rc = mc__tp_all_reduce(target_logit, target_logit, (size_t)N, MC_F32, tp)) != MC_OK)
        goto done;
    /* 3. The sum of exp(logit - max); with smoothing the row sums of the logits ride along
          ([sum_exp | logit_sum], one all-reduce of 2N). */
    if (smoothing) {
        packed = target_logit + N;
        if ((rc = ops->sum_exp(ops, packed, logits, max, N, Vl, dt)) != MC_OK) goto done;
        if ((rc = ops->row_sum(ops, packed + N, logits, N, Vl, dt)) != MC_OK) goto done;
        if (tp_size > 1 &&
            (rc = mc__tp_all_reduce(packed, packed, 2 * (size_t)N, MC_F32, tp)) != MC_OK)
            goto done;
        if ((rc = ops->copy(ops, sum_exp, packed, (size_t)N, MC_F32, MC_F32)) != MC_OK) goto done;
    } else {
        if ((rc = ops->sum_exp(ops, sum_exp, logits, max, N, Vl, dt)) != MC_OK) goto done;
        if (tp_size > 1 &&
            (rc = mc_all_reduce(tp, sum_exp, sum_exp, (size_t)N, MC_F32,
                                mc__ce_reduce_op(MC_SUM))) != MC_OK)
            goto done;
    }
    /* 4. The per-token loss (and its sum) from the pieces, an op: nothing is read back. */
    rc = ops->cross_entropy_loss(ops, losses, loss_sum, max, sum_exp, target_logit,
                                 smoothing ? packed + N : NULL, N, V,
                                 mc__tp_smoothing_s(label_smoothing, V));
done:
    mc__tp_scratch_put(&s, ops);
    return rc;
}

MC_API int mc_vocab_parallel_cross_entropy_backward(void *dlogits, const float *dlosses,
                                                    const void *logits, const float *max,
                                                    const float *sum_exp, const int *targets,
                                                    int N, int V, float label_smoothing,
                                                    mc_dtype dt, mc_comm *tp,
                                                    const mc_ops *ops) {
    static const char fn[] = "vocab_parallel_cross_entropy_backward";
    int rc, Vl;
    if ((rc = mc__tp_ce_check(fn, targets, N, V, label_smoothing, dt, tp, ops)) != MC_OK)
        return rc;
    Vl = V / mc__tp_size(tp);
    return ops->cross_entropy_backward(ops, dlogits, logits, max, sum_exp, targets, dlosses, N,
                                       Vl, mc__tp_rank(tp) * Vl,
                                       mc__tp_smoothing_s(label_smoothing, V), V, dt);
}

// CPU initialisation (§3.1): every element of the global master comes from its own index, so
// any shard at any TP size is computed without the others.

MC_API int mc_shard_global_index(int local_index, int global_dim, int stride, int tp_rank,
                                 int tp_size) {
    int per_rank, piece;
    if (tp_size <= 0 || stride <= 0 || tp_rank < 0 || tp_rank >= tp_size || global_dim <= 0)
        return -1;
    if (global_dim % tp_size != 0 || (global_dim / tp_size) % stride != 0) return -1;
    per_rank = global_dim / tp_size;
    if (local_index < 0 || local_index >= per_rank) return -1;
    piece = per_rank / stride;
    /* my k-th piece is global piece k * TP + r */
    return ((local_index / piece) * tp_size + tp_rank) * piece + local_index % piece;
}

/* The Philox key of a parameter: FNV-1a over the name's bytes, then over the seed's 8
   little-endian bytes, so two parameters (or two seeds) get unrelated streams. */
static uint64_t mc__init_key(const char *name, uint64_t seed) {
    uint64_t h = mc__fnv_bytes(MC__FNV_OFFSET, name, strlen(name));
    return mc__fnv_int(h, seed);
}

/* normal(0, 1) of global element g: Box-Muller on lanes 0 and 1 of the Philox block at
   counter g (32-bit uniforms; u1 in (0, 1] keeps the log finite). Lanes 2 and 3 are unused, so
   every element needs only its own index. */
static double mc__init_normal_at(uint64_t key, uint64_t g) {
    uint32_t block[4];
    double u1, u2;
    mc__rng_block(key, g, block);
    u1 = ((double)block[0] + 1.0) * (1.0 / 4294967296.0);
    u2 = (double)block[1] * (1.0 / 4294967296.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

MC_API void mc_init_normal_shard(float *local, const char *name, int rows, int cols,
                                 int partition_dim, int stride, int tp_rank, int tp_size,
                                 float std, uint64_t seed) {
    static const char fn[] = "init_normal_shard";
    int split_rows, split_cols, lr, lc, i, j;
    uint64_t key;
    if (!local || !name || rows <= 0 || cols <= 0 || partition_dim < -1 || partition_dim > 1) {
        MC__FAIL(MC_ERR_INVALID_ARG,
                 "%s: invalid arguments (name %s, shape [%d, %d], partition_dim %d); nothing "
                 "written",
                 fn, name ? name : "NULL", rows, cols, partition_dim);
        return;
    }
    /* A 1-D tensor (rows == 1) splits along its only dimension. */
    split_rows = partition_dim == 0 && rows > 1;
    split_cols = partition_dim == 1 || (partition_dim == 0 && rows == 1);
    lr = split_rows ? rows / (tp_size > 0 ? tp_size : 1) : rows;
    lc = split_cols ? cols / (tp_size > 0 ? tp_size : 1) : cols;
    if (partition_dim >= 0 && mc_shard_global_index(0, split_rows ? rows : cols, stride, tp_rank,
                                                    tp_size) < 0) {
        MC__FAIL(MC_ERR_INVALID_ARG,
                 "%s: %s [%d, %d]: partition dim size %d does not split into tp_size (%d) x "
                 "stride (%d) pieces for tp_rank %d; nothing written",
                 fn, name, rows, cols, split_rows ? rows : cols, tp_size, stride, tp_rank);
        return;
    }
    key = mc__init_key(name, seed);
    for (i = 0; i < lr; i++) {
        int gi = split_rows ? mc_shard_global_index(i, rows, stride, tp_rank, tp_size) : i;
        for (j = 0; j < lc; j++) {
            int gj = split_cols ? mc_shard_global_index(j, cols, stride, tp_rank, tp_size) : j;
            double z = mc__init_normal_at(key, (uint64_t)gi * (uint64_t)cols + (uint64_t)gj);
            local[(size_t)i * lc + j] = (float)((double)std * z);
        }
    }
}

/* @tensor_parallel:implementation end */

// ---------------------------------------------------------------------------------------------
// >>tensor_parallel.random
//
// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): ten rounds of two 32x32->64 multiplies mixing a 128-bit counter under a 64-bit key
// that is bumped by the Weyl constants between rounds. Known-answer vectors from Random123 are
// in tests/test_rng.c.

#define MC__PHILOX_M0 0xD2511F53u   /* round multipliers */
#define MC__PHILOX_M1 0xCD9E8D57u
#define MC__PHILOX_W0 0x9E3779B9u   /* key bumps: golden ratio, sqrt(3) - 1 */
#define MC__PHILOX_W1 0xBB67AE85u

MC_API void mc_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    int round;
    for (round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)MC__PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)MC__PHILOX_M1 * c2;
        c0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        c1 = (uint32_t)p1;
        c2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c3 = (uint32_t)p0;
        k0 += MC__PHILOX_W0;
        k1 += MC__PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The four elements 4 * block .. 4 * block + 3 of the stream with `seed`. */
static void mc__rng_block(uint64_t seed, uint64_t block, uint32_t out[4]) {
    uint32_t counter[4], key[2];
    counter[0] = (uint32_t)block;
    counter[1] = (uint32_t)(block >> 32);
    counter[2] = 0;
    counter[3] = 0;
    key[0] = (uint32_t)seed;
    key[1] = (uint32_t)(seed >> 32);
    mc_philox4x32_10(counter, key, out);
}

/* 24 random bits scaled by 2^-24: every value is exact in a float and below 1. */
static float mc__rng_to_uniform(uint32_t bits) {
    return (float)(bits >> 8) * (1.0f / 16777216.0f);
}

MC_API uint32_t mc_rng_bits_at(uint64_t seed, uint64_t index) {
    uint32_t block[4];
    mc__rng_block(seed, index / 4, block);
    return block[index % 4];
}

MC_API float mc_rng_uniform_at(uint64_t seed, uint64_t index) {
    return mc__rng_to_uniform(mc_rng_bits_at(seed, index));
}

/* Calls emit(i, uniform) for the next n elements of the stream, one Philox block per four,
   then moves the offset past them to the next block boundary. */
typedef void (*mc__rng_emit)(void *dst, size_t i, float uniform, float arg);

static void mc__rng_draw(mc_rng *rng, size_t n, mc__rng_emit emit, void *dst, float arg) {
    uint32_t block[4];
    uint64_t have = UINT64_MAX;   /* index of the block in `block` */
    size_t i;
    for (i = 0; i < n; i++) {
        uint64_t g = rng->offset + i;
        if (g / 4 != have) {
            have = g / 4;
            mc__rng_block(rng->seed, have, block);
        }
        emit(dst, i, mc__rng_to_uniform(block[g % 4]), arg);
    }
    rng->offset += ((uint64_t)n + 3) / 4 * 4;
}

static void mc__rng_emit_uniform(void *dst, size_t i, float uniform, float arg) {
    (void)arg;
    ((float *)dst)[i] = uniform;
}

static void mc__rng_emit_keep(void *dst, size_t i, float uniform, float p) {
    ((uint8_t *)dst)[i] = (uint8_t)(uniform >= p);
}

MC_API int mc_rng_uniform(mc_rng *rng, float *out, size_t n) {
    if (!rng || (!out && n > 0))
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_rng_uniform: rng (%p) and out (%p) must be set",
                        (void *)rng, (void *)out);
    mc__rng_draw(rng, n, mc__rng_emit_uniform, out, 0.0f);
    return MC_OK;
}

MC_API int mc_rng_dropout_mask(mc_rng *rng, uint8_t *mask, size_t n, float p) {
    if (!rng || (!mask && n > 0))
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_rng_dropout_mask: rng (%p) and mask (%p) must be set", (void *)rng,
                        (void *)mask);
    if (!(p >= 0.0f && p <= 1.0f))
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_rng_dropout_mask: dropout probability p (%g) must be in [0, 1]",
                        (double)p);
    mc__rng_draw(rng, n, mc__rng_emit_keep, mask, p);
    return MC_OK;
}

// ---------------------------------------------------------------------------------------------
// >>tensor_parallel.random tracker

/* Index of the stream called `name`, or -1. */
static int mc__rng_find(const mc_rng_states *s, const char *name) {
    int i;
    for (i = 0; i < s->n_streams; i++)
        if (strcmp(s->names[i], name) == 0) return i;
    return -1;
}

MC_API void mc_rng_tracker_reset(mc_rng_tracker *t) {
    mc_rng current;
    if (!t) return;
    current = t->s.current;
    memset(t, 0, sizeof *t);
    t->s.current = current;
}

MC_API void mc_rng_tracker_manual_seed(mc_rng_tracker *t, uint64_t seed) {
    if (!t) return;
    t->s.current.seed = seed;
    t->s.current.offset = 0;
}

MC_API int mc_rng_tracker_add(mc_rng_tracker *t, const char *name, uint64_t seed) {
    int i;
    if (!t || !name)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_rng_tracker_add: tracker and name must be set");
    /* Megatron checks the seed first, then the name. */
    for (i = 0; i < t->n_seeds; i++)
        if (t->seeds[i] == seed)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "mc_rng_tracker_add(\"%s\", %llu): seed %llu already exists (every "
                            "stream needs its own seed)",
                            name, (unsigned long long)seed, (unsigned long long)seed);
    if (mc__rng_find(&t->s, name) >= 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_rng_tracker_add: rng state \"%s\" already exists",
                        name);
    if (name[0] == '\0' || strlen(name) >= MC_RNG_NAME_MAX || strcmp(name, MC_RNG_DEFAULT) == 0)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_rng_tracker_add: name \"%s\" must be 1 to %d characters and not \"%s\"",
                        name, MC_RNG_NAME_MAX - 1, MC_RNG_DEFAULT);
    if (t->s.n_streams == MC_RNG_MAX_STREAMS || t->n_seeds == MC_RNG_MAX_STREAMS)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_rng_tracker_add(\"%s\"): the tracker holds at most "
                        "MC_RNG_MAX_STREAMS (%d) streams",
                        name, MC_RNG_MAX_STREAMS);
    t->seeds[t->n_seeds++] = seed;
    i = t->s.n_streams++;
    memcpy(t->s.names[i], name, strlen(name) + 1);
    t->s.streams[i].seed = seed;
    t->s.streams[i].offset = 0;
    return MC_OK;
}

MC_API int mc_rng_tracker_fork(mc_rng_tracker *t, const char *name) {
    int index;
    if (!t || !name)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_rng_tracker_fork: tracker and name must be set");
    index = mc__rng_find(&t->s, name);
    if (index < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_rng_tracker_fork: rng state \"%s\" is not added",
                        name);
    if (t->depth == MC_RNG_MAX_FORK_DEPTH)
        return MC__FAIL(MC_ERR_STATE,
                        "mc_rng_tracker_fork(\"%s\"): more than MC_RNG_MAX_FORK_DEPTH (%d) nested "
                        "forks",
                        name, MC_RNG_MAX_FORK_DEPTH);
    /* An active stream's progress goes back to its slot, so that forking it again inside
       this fork continues it instead of repeating its numbers. */
    if (t->active > 0) t->s.streams[t->active - 1] = t->s.current;
    t->stack[t->depth].outer = t->active;
    t->stack[t->depth].saved = t->s.current;
    t->depth++;
    t->s.current = t->s.streams[index];
    t->active = index + 1;
    return MC_OK;
}

MC_API int mc_rng_tracker_unfork(mc_rng_tracker *t, const char *name) {
    int outer;
    if (!t || !name)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_rng_tracker_unfork: tracker and name must be set");
    if (t->depth == 0 || strcmp(mc_rng_tracker_active_name(t), name) != 0)
        return MC__FAIL(MC_ERR_STATE,
                        "mc_rng_tracker_unfork(\"%s\"): current state name %s is not the same as "
                        "the desired state name %s (unfork closes the innermost fork)",
                        name, mc_rng_tracker_active_name(t), name);
    t->s.streams[t->active - 1] = t->s.current;
    t->depth--;
    outer = t->stack[t->depth].outer;
    /* The outer stream may have advanced in a nested fork of it: take it from its slot. */
    t->s.current = outer > 0 ? t->s.streams[outer - 1] : t->stack[t->depth].saved;
    t->active = outer;
    return MC_OK;
}

MC_API mc_rng *mc_rng_tracker_current(mc_rng_tracker *t) { return t ? &t->s.current : NULL; }

MC_API const char *mc_rng_tracker_active_name(const mc_rng_tracker *t) {
    if (!t || t->active <= 0 || t->active > t->s.n_streams) return MC_RNG_DEFAULT;
    return t->s.names[t->active - 1];
}

MC_API int mc_rng_tracker_get(const mc_rng_tracker *t, const char *name, mc_rng *out) {
    int index;
    if (!t || !name || !out)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_rng_tracker_get: tracker, name and out must be set");
    index = mc__rng_find(&t->s, name);
    if (index < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_rng_tracker_get: rng state \"%s\" is not added",
                        name);
    *out = t->s.streams[index];
    return MC_OK;
}

MC_API int mc_rng_tracker_get_states(const mc_rng_tracker *t, mc_rng_states *out) {
    if (!t || !out)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_rng_tracker_get_states: tracker and out must be set");
    *out = t->s;
    return MC_OK;
}

MC_API int mc_rng_tracker_set_states(mc_rng_tracker *t, const mc_rng_states *states) {
    int i;
    if (!t || !states)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_rng_tracker_set_states: tracker and states must be set");
    if (states->n_streams < 0 || states->n_streams > MC_RNG_MAX_STREAMS)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_rng_tracker_set_states: n_streams (%d) must be in [0, %d]",
                        states->n_streams, MC_RNG_MAX_STREAMS);
    /* Open forks refer to streams by position. */
    if (t->depth > 0) {
        int same = states->n_streams == t->s.n_streams;
        for (i = 0; same && i < states->n_streams; i++)
            same = strcmp(states->names[i], t->s.names[i]) == 0;
        if (!same)
            return MC__FAIL(MC_ERR_STATE,
                            "mc_rng_tracker_set_states: %d fork(s) open on \"%s\", so the states "
                            "must list the same streams in the same order",
                            t->depth, mc_rng_tracker_active_name(t));
    }
    t->s = *states;
    return MC_OK;
}

MC_API int mc_rng_tracker_seed_megatron(mc_rng_tracker *t, long long seed, int tp_rank,
                                        int pp_rank, int ep_rank, int etp_rank, int dp_rank,
                                        int data_parallel_random_init) {
    long long stage_seed;
    int rc;
    if (!t) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_rng_tracker_seed_megatron: tracker is NULL");
    if (seed <= 0)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_rng_tracker_seed_megatron: seed (%lld) must be > 0", seed);
    if (tp_rank < 0 || pp_rank < 0 || ep_rank < 0 || etp_rank < 0 || dp_rank < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_rng_tracker_seed_megatron: ranks must be >= 0 (tp %d, pp %d, ep %d, "
                        "etp %d, dp %d)",
                        tp_rank, pp_rank, ep_rank, etp_rank, dp_rank);
    /* Pipeline stages differ by 100 (and data-parallel replicas by 10 when asked), so that
       stages do not draw the same dropout masks. */
    stage_seed = seed + 100LL * pp_rank;
    if (data_parallel_random_init) stage_seed += 10LL * dp_rank;
    mc_rng_tracker_reset(t);
    mc_rng_tracker_manual_seed(t, (uint64_t)stage_seed);
    if ((rc = mc_rng_tracker_add(t, MC_RNG_DATA_PARALLEL, (uint64_t)stage_seed)) != MC_OK)
        return rc;
    /* Distinct per TP rank, identical across DP: TP-split activations get different masks. */
    if ((rc = mc_rng_tracker_add(t, MC_RNG_MODEL_PARALLEL,
                                 (uint64_t)(stage_seed + 2718 + tp_rank))) != MC_OK)
        return rc;
    return mc_rng_tracker_add(t, MC_RNG_EXPERT_PARALLEL,
                              (uint64_t)(stage_seed + 1024 + 100LL * ep_rank + etp_rank));
}

/* =============================================================================================
   pipeline_parallel (implementation) */

// ---------------------------------------------------------------------------------------------
// >>pipeline_parallel.schedule_table
//
// The op order of Megatron's schedules (pipeline_parallel/schedules.py), without the compute
// and the P2P calls in between: what each stage runs, and in which order.

/* A validated desc with every default filled in. */
typedef struct mc__sched {
    int pp, rank, m, v, n, forward_only, interleaved;
} mc__sched;

static int mc__sched_resolve(const mc_schedule_desc *d, mc__sched *s) {
    if (!d) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_schedule_desc is NULL");
    memset(s, 0, sizeof *s);
    s->pp = MC__DEF(d->pp, 1);
    s->rank = d->pp_rank;
    s->m = d->num_microbatches;
    s->v = d->vpp > 1 ? d->vpp : 1;
    s->forward_only = d->forward_only != 0;
    s->interleaved = d->vpp > 1;
    if (s->pp < 1)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_schedule_desc.pp (%d) must be >= 1", d->pp);
    if (s->rank < 0 || s->rank >= s->pp)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_schedule_desc.pp_rank (%d) must be in [0, pp = %d)",
                        s->rank, s->pp);
    if (s->m < 1)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_schedule_desc.num_microbatches (%d) must be >= 1", s->m);
    if (d->vpp < 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_schedule_desc.vpp (%d) must be >= 0 (0 or 1: not interleaved)", d->vpp);
    if (d->group_size < 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_schedule_desc.group_size (%d) must be >= 0 (0: pp)", d->group_size);
    if ((long long)s->m * s->v * 2 > INT_MAX)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "num_microbatches (%d) x vpp (%d) is too large for one op list", s->m, s->v);
    s->n = MC__DEF(d->group_size, s->pp);
    if (!s->interleaved) return MC_OK;
    if (s->pp <= 1)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "pipeline-model-parallel size should be greater than 1 with interleaved "
                        "schedule (mc_schedule_desc.vpp = %d, pp = %d)",
                        d->vpp, s->pp);
    if (s->n < s->pp || s->n > s->m)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "the number of contiguous micro-batches in a virtual pipeline stage "
                        "(group_size N = %d) should range in [PP = %d, M = %d]",
                        s->n, s->pp, s->m);
    if (s->m % s->n != 0 && s->m % s->n < s->pp)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "the remainder of M (num_microbatches %d) divided by N (group_size %d) "
                        "should be 0 or >= the pipeline-parallel size %d, but it is %d: a last "
                        "group smaller than PP introduces dependency bubbles (with the default "
                        "N = PP, M must be a multiple of PP)",
                        s->m, s->n, s->pp, s->m % s->n);
    return MC_OK;
}

static int mc__sched_total(const mc__sched *s) { return s->m * s->v; }

/* Megatron's warmup forward count for this stage. */
static int mc__sched_warmup(const mc__sched *s) {
    int total = mc__sched_total(s), warmup;
    if (s->interleaved) {
        warmup = s->forward_only ? total : (s->pp - s->rank - 1) * 2 + (s->v - 1) * s->n;
        return warmup < total ? warmup : total;
    }
    if (s->pp == 1) return 0;
    warmup = s->pp - s->rank - 1;
    return warmup < s->m ? warmup : s->m;
}

/* Row k of the interleaved table: groups of n micro-batches (the last holds what remains),
   each run on chunk 0, then chunk 1, ... */
static void mc__sched_table_entry(const mc__sched *s, int k, int *microbatch, int *chunk) {
    int per_group = s->n * s->v;
    int group_start = (k / per_group) * s->n;
    int group_len = group_start + s->n <= s->m ? s->n : s->m - group_start;
    int in_group = k - (k / per_group) * per_group;
    *chunk = in_group / group_len;
    *microbatch = group_start + in_group % group_len;
}

static int mc__sched_push(mc_sched_op *out, int n, char kind, int microbatch, int chunk) {
    if (out) {
        out[n].kind = kind;
        out[n].microbatch = microbatch;
        out[n].chunk = chunk;
    }
    return n + 1;
}

/* Forward and backward of virtual micro-batch k. Not interleaved: micro-batch k, chunk 0. */
static int mc__sched_push_forward(const mc__sched *s, mc_sched_op *out, int n, int k) {
    int mb = k, chunk = 0;
    if (s->interleaved) mc__sched_table_entry(s, k, &mb, &chunk);
    return mc__sched_push(out, n, 'F', mb, chunk);
}

static int mc__sched_push_backward(const mc__sched *s, mc_sched_op *out, int n, int k) {
    int mb = k, chunk = 0;
    if (s->interleaved) mc__sched_table_entry(s, k, &mb, &chunk);
    return mc__sched_push(out, n, 'B', mb, s->v - 1 - chunk);
}

/* Writes the ops of a resolved schedule (out has room for all of them, or is NULL). */
static int mc__sched_fill(const mc__sched *s, mc_sched_op *out) {
    int total = mc__sched_total(s), warmup = mc__sched_warmup(s), remaining, k, n = 0;
    if (s->forward_only) {
        for (k = 0; k < total; k++) n = mc__sched_push_forward(s, out, n, k);
        return n;
    }
    remaining = total - warmup;
    for (k = 0; k < warmup; k++) n = mc__sched_push_forward(s, out, n, k);
    for (k = 0; k < remaining; k++) {   /* steady state: one forward, one backward */
        n = mc__sched_push_forward(s, out, n, warmup + k);
        n = mc__sched_push_backward(s, out, n, k);
    }
    for (k = remaining; k < total; k++) n = mc__sched_push_backward(s, out, n, k);
    return n;
}

static int mc__sched_count(const mc__sched *s) {
    return mc__sched_total(s) * (s->forward_only ? 1 : 2);
}

MC_API const char *mc_schedule_name(const mc_schedule_desc *desc) {
    mc__sched s;
    if (mc__sched_resolve(desc, &s) != MC_OK) return NULL;
    if (s.pp == 1) return "no_pipelining";
    return s.interleaved ? "with_interleaving" : "without_interleaving";
}

MC_API int mc_schedule_ops(const mc_schedule_desc *desc, mc_sched_op *out, int cap,
                           int *n_warmup) {
    mc__sched s;
    int rc = mc__sched_resolve(desc, &s), count;
    if (rc != MC_OK) return rc;
    count = mc__sched_count(&s);
    if (out && cap < count)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_schedule_ops: cap (%d) is below the op count %d of stage %d", cap,
                        count, s.rank);
    if (n_warmup) *n_warmup = mc__sched_warmup(&s);
    return out ? mc__sched_fill(&s, out) : count;   /* counting needs no walk */
}

MC_API int mc_schedule_table(const mc_schedule_desc *desc, int *microbatch, int *chunk,
                             int cap) {
    mc__sched s;
    int rc = mc__sched_resolve(desc, &s), total, k;
    if (rc != MC_OK) return rc;
    total = mc__sched_total(&s);
    if ((microbatch || chunk) && cap < total)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_schedule_table: cap (%d) is below M x V = %d",
                        cap, total);
    for (k = 0; k < total; k++) {
        int mb = k, c = 0;
        if (s.interleaved) mc__sched_table_entry(&s, k, &mb, &c);
        if (microbatch) microbatch[k] = mb;
        if (chunk) chunk[k] = c;
    }
    return total;
}

MC_API int mc_schedule_max_in_flight(const mc_schedule_desc *desc, int *per_chunk) {
    mc__sched s;
    int held[MC_MAX_VPP], most[MC_MAX_VPP], rc = mc__sched_resolve(desc, &s), total, warmup, k, c;
    int mb, best = 0;
    if (rc != MC_OK) return rc;
    if (s.v > MC_MAX_VPP)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_schedule_max_in_flight: vpp (%d) above "
                        "MC_MAX_VPP (%d)", s.v, MC_MAX_VPP);
    memset(held, 0, sizeof held);
    memset(most, 0, sizeof most);
    total = mc__sched_total(&s);
    warmup = s.forward_only ? 0 : mc__sched_warmup(&s);
    /* F(k) adds its chunk, B(k) removes the mirrored chunk, in mc__sched_fill's order */
#define MC__SCHED_F(kk)                                                                   \
    do {                                                                                  \
        mb = (kk), c = 0;                                                                 \
        if (s.interleaved) mc__sched_table_entry(&s, (kk), &mb, &c);                      \
        if (++held[c] > most[c]) most[c] = held[c];                                       \
        if (s.forward_only) held[c]--;                                                    \
    } while (0)
#define MC__SCHED_B(kk)                                                                   \
    do {                                                                                  \
        mb = (kk), c = 0;                                                                 \
        if (s.interleaved) mc__sched_table_entry(&s, (kk), &mb, &c);                      \
        held[s.v - 1 - c]--;                                                              \
    } while (0)
    for (k = 0; k < warmup; k++) MC__SCHED_F(k);
    for (k = 0; k < total - warmup; k++) {
        MC__SCHED_F(warmup + k);
        if (!s.forward_only) MC__SCHED_B(k);
    }
#undef MC__SCHED_F
#undef MC__SCHED_B
    (void)mb;
    for (c = 0; c < s.v; c++) {
        if (per_chunk) per_chunk[c] = most[c];
        if (most[c] > best) best = most[c];
    }
    return best;
}

/* Finish times of F and B per (stage, chunk, micro-batch); < 0 while not run yet. */
typedef struct mc__sched_sim {
    const mc__sched *s;
    double *f_end, *b_end;
} mc__sched_sim;

static double *mc__sim_slot(const mc__sched_sim *sim, double *table, int stage, int chunk,
                            int mb) {
    return &table[((size_t)stage * sim->s->v + (size_t)chunk) * sim->s->m + (size_t)mb];
}

/* When the input of `op` on `stage` is ready, or -1 when its producer has not run yet.
   Virtual stage chunk * pp + stage: forwards flow up, backwards flow down. */
static double mc__sim_ready(const mc__sched_sim *sim, int stage, const mc_sched_op *op) {
    const mc__sched *s = sim->s;
    int vs = op->chunk * s->pp + stage, last_vs = s->v * s->pp - 1;
    double t = 0.0, dep;
    if (op->kind == 'F') {
        if (vs == 0) return 0.0;
        return *mc__sim_slot(sim, sim->f_end, (vs - 1) % s->pp, (vs - 1) / s->pp, op->microbatch);
    }
    dep = *mc__sim_slot(sim, sim->f_end, stage, op->chunk, op->microbatch);
    if (dep < 0) return -1.0;
    t = dep;
    if (vs < last_vs) {
        dep = *mc__sim_slot(sim, sim->b_end, (vs + 1) % s->pp, (vs + 1) / s->pp, op->microbatch);
        if (dep < 0) return -1.0;
        if (dep > t) t = dep;
    }
    return t;
}

MC_API int mc_schedule_simulate(const mc_schedule_desc *desc, double forward_time,
                                double backward_time, double *start, int cap,
                                mc_schedule_timing *timing) {
    mc_schedule_desc one;
    mc__sched s;
    mc__sched_sim sim;
    mc_sched_op *ops = NULL;
    double *clock = NULL, *times = NULL, makespan = 0.0, busy;
    int *next = NULL, rc, count, stage, done = 0, progress = 1;
    long sweep = 0;
    size_t slots, i;
    if (!desc) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_schedule_simulate: desc is NULL");
    one = *desc;
    one.pp_rank = 0;
    if ((rc = mc__sched_resolve(&one, &s)) != MC_OK) return rc;
    if (forward_time < 0 || backward_time < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_schedule_simulate: forward_time (%g) and backward_time (%g) must be "
                        ">= 0 (0: 1 and 2)",
                        forward_time, backward_time);
    forward_time = forward_time > 0 ? forward_time : 1.0;
    backward_time = backward_time > 0 ? backward_time : 2.0;
    count = mc__sched_count(&s);
    if (start && (long long)cap < (long long)count * s.pp)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_schedule_simulate: cap (%d) is below pp x ops per stage = %d x %d",
                        cap, s.pp, count);
    slots = (size_t)s.pp * (size_t)s.v * (size_t)s.m;
    ops = (mc_sched_op *)mc_malloc(sizeof *ops * (size_t)count * (size_t)s.pp);
    times = (double *)mc_malloc(sizeof *times * (slots * 2 + (size_t)count * (size_t)s.pp +
                                                 (size_t)s.pp));
    next = (int *)mc_calloc((size_t)s.pp, sizeof *next);
    if (!ops || !times || !next) {
        mc_free(ops);
        mc_free(times);
        mc_free(next);
        return MC__FAIL(MC_ERR_NO_MEMORY, "mc_schedule_simulate: out of memory for %d x %d ops",
                        s.pp, count);
    }
    sim.s = &s;
    sim.f_end = times;
    sim.b_end = times + slots;
    clock = times + 2 * slots + (size_t)count * (size_t)s.pp;
    for (i = 0; i < 2 * slots; i++) times[i] = -1.0;
    for (stage = 0; stage < s.pp; stage++) {
        mc__sched stage_s = s;
        stage_s.rank = stage;
        mc__sched_fill(&stage_s, ops + (size_t)stage * (size_t)count);
        clock[stage] = 0.0;
    }
    /* Start times follow from finish times alone, so sweeping the stages in any order and
       running each one as far as its inputs allow gives the same answer. Forwards flow to
       higher stages and backwards to lower ones, so the sweeps alternate direction: one pair
       of sweeps carries a micro-batch through every stage and back, and the work stays
       linear in pp (one direction only would need a sweep per stage: pp^2). */
    while (done < count * s.pp && progress) {
        progress = 0;
        for (i = 0; i < (size_t)s.pp; i++) {
            stage = sweep % 2 == 0 ? (int)i : s.pp - 1 - (int)i;
            while (next[stage] < count) {
                size_t at = (size_t)stage * (size_t)count + (size_t)next[stage];
                const mc_sched_op *op = &ops[at];
                double ready = mc__sim_ready(&sim, stage, op);
                double begin, length = op->kind == 'F' ? forward_time : backward_time;
                if (ready < 0) break;
                begin = ready > clock[stage] ? ready : clock[stage];
                clock[stage] = begin + length;
                *mc__sim_slot(&sim, op->kind == 'F' ? sim.f_end : sim.b_end, stage, op->chunk,
                              op->microbatch) = clock[stage];
                times[2 * slots + at] = begin;
                if (clock[stage] > makespan) makespan = clock[stage];
                next[stage]++;
                done++;
                progress = 1;
            }
        }
        sweep++;
    }
    rc = MC_OK;
    if (done < count * s.pp) {
        rc = MC__FAIL(MC_ERR_STATE,
                      "mc_schedule_simulate: the schedule deadlocks: stage 0 waits at op %d of %d",
                      next[0], count);
    } else {
        busy = (double)s.m * s.v * (forward_time + (s.forward_only ? 0.0 : backward_time));
        if (start) memcpy(start, times + 2 * slots, sizeof *start * (size_t)count * (size_t)s.pp);
        if (timing) {
            timing->makespan = makespan;
            timing->busy = busy;
            timing->bubble_fraction = (makespan - busy) / makespan;
            timing->bubble_ratio = (makespan - busy) / busy;
        }
    }
    mc_free(ops);
    mc_free(times);
    mc_free(next);
    return rc;
}

/* @schedules:implementation begin */

// ---------------------------------------------------------------------------------------------
// >>pipeline_parallel.schedules
//
// Megatron's forward_backward functions over the op order of >>pipeline_parallel.schedule_table.
// The loops keep Megatron's shape (warmup, steady 1F1B, cooldown) because the P2P calls hang off
// that shape;
// the tests check that the executed order equals mc_schedule_ops.

/* One run of a schedule on this rank. Received tensors are indexed by (chunk, micro-batch):
   every stage sends a chunk's tensors in micro-batch order, so the n-th tensor received for
   chunk c belongs to micro-batch n (Megatron's per-chunk FIFO lists). */
typedef struct mc__pipe {
    const mc_schedule_hooks *h;
    mc_schedule_result *res;
    mc_comm *pp_comm;            /* NULL when PP = 1 */
    int pp, rank, v, m, forward_only;
    int prev, next;              /* cyclic neighbours in the pp group */
    int total, warmup;           /* M*V virtual micro-batches; warmup forwards */
    int *mb_of, *chunk_of;       /* (M*V) the interleaved table (identity when V = 1) */
    float **input;               /* (V*M) received activation of (chunk, mb), NULL once used */
    float **out_grad;            /* (V*M) received gradient of (chunk, mb) */
    int *n_inputs, *n_grads;     /* (V) tensors received so far per chunk */
    double *tokens;              /* (M) num_tokens per micro-batch, last virtual stage */
    float **spare;               /* free receive buffers, reused before allocating */
    int n_spare;
    int dropped;                 /* fault hook: the caller's micro-batch skipped, or -1 */
    /* The executor's own order is checked against mc_schedule_ops before any P2P: a dry run
       of the loops (no compute, no communication) records it, and the real run re-checks
       every op as it starts. */
    int dry;                     /* 1 during the dry run */
    mc_sched_op *expect;         /* (n_expect) mc_schedule_ops of this stage */
    int n_expect, n_checked;
    const mc_ops *ops;           /* the world's memory owner: the timeline marks ops on it */
    long long tl_op;             /* the timeline event of the op running now, or -1 */
} mc__pipe;

#if defined(MC_FAULT_HOOKS)
static int mc__fault_drop = -1;
MC_API void mc_fault_schedule_drop_microbatch(int microbatch) { mc__fault_drop = microbatch; }
#endif

/* The caller's id of the executor's micro-batch mb (they differ only under the fault hook). */
static int mc__pipe_app_mb(const mc__pipe *p, int mb) {
    return p->dropped >= 0 && mb >= p->dropped ? mb + 1 : mb;
}
/* The caller's M: the backward seed divides by it. */
static int mc__pipe_caller_m(const mc__pipe *p) { return p->m + (p->dropped >= 0); }

static int mc__pipe_slot(const mc__pipe *p, int chunk, int mb) { return chunk * p->m + mb; }
static int mc__pipe_first_virtual(const mc__pipe *p, int chunk) {
    return p->rank == 0 && chunk == 0;
}
static int mc__pipe_last_virtual(const mc__pipe *p, int chunk) {
    return p->rank == p->pp - 1 && chunk == p->v - 1;
}
/* Megatron's get_model_chunk_id: backward k runs the table's chunk mirrored, V - 1 - c. */
static int mc__pipe_chunk(const mc__pipe *p, int k, int forward) {
    int c = p->chunk_of[k % p->total];
    return forward ? c : p->v - 1 - c;
}

static float *mc__pipe_buffer(mc__pipe *p) {
    if (p->n_spare > 0) return p->spare[--p->n_spare];
    size_t bytes = mc_dtype_bytes(p->h->tensor_dtype, p->h->tensor_elems);
    return (float *)mc_comm_alloc(p->pp_comm, bytes);
}

/* Every buffer ever handed out is either in a slot or spare, so spare (2*V*M) never overflows. */
static void mc__pipe_release(mc__pipe *p, float **slot) {
    if (*slot) p->spare[p->n_spare++] = *slot;
    *slot = NULL;
}

static void mc__pipe_free(mc__pipe *p) {
    int i, slots = p->v * p->m;
    for (i = 0; p->input && i < slots; i++) mc__pipe_release(p, &p->input[i]);
    for (i = 0; p->out_grad && i < slots; i++) mc__pipe_release(p, &p->out_grad[i]);
    for (i = 0; i < p->n_spare; i++) mc_comm_free(p->pp_comm, p->spare[i]);
    mc_free(p->mb_of);
    mc_free(p->chunk_of);
    mc_free(p->input);
    mc_free(p->out_grad);
    mc_free(p->n_inputs);
    mc_free(p->n_grads);
    mc_free(p->tokens);
    mc_free(p->spare);
    mc_free(p->expect);
}

/* Megatron's _communicate in batched mode: send_prev, recv_prev, send_next, recv_next, in that
   order, as one batch waited as a whole. A NULL send or a recv chunk < 0 leaves that op out;
   a received tensor goes to the next free micro-batch slot of its chunk. */
static int mc__pipe_communicate(mc__pipe *p, const float *send_next, const float *send_prev,
                                int recv_prev_chunk, int recv_next_chunk) {
    mc_p2p_op ops[4];
    int n = 0, rc;
    float *from_prev = NULL, *from_next = NULL;
    if (p->dry) return MC_OK;
    if (recv_prev_chunk >= 0 && p->n_inputs[recv_prev_chunk] >= p->m)
        return MC__FAIL(MC_ERR_STATE, "schedule: pp rank %d would receive activation %d for "
                        "chunk %d, but M = %d", p->rank, p->m + 1, recv_prev_chunk, p->m);
    if (recv_next_chunk >= 0 && p->n_grads[recv_next_chunk] >= p->m)
        return MC__FAIL(MC_ERR_STATE, "schedule: pp rank %d would receive gradient %d for "
                        "chunk %d, but M = %d", p->rank, p->m + 1, recv_next_chunk, p->m);
    if ((recv_prev_chunk >= 0 && !(from_prev = mc__pipe_buffer(p))) ||
        (recv_next_chunk >= 0 && !(from_next = mc__pipe_buffer(p)))) {
        mc__pipe_release(p, &from_prev);
        return MC__FAIL(MC_ERR_NO_MEMORY, "schedule: out of memory for a %zu-element P2P buffer",
                        p->h->tensor_elems);
    }
#define MC__P2P_OP(send, buffer, peer_rank, tag_value)                          \
    do {                                                                        \
        ops[n].is_send = (send);                                                \
        ops[n].buf = (void *)(uintptr_t)(buffer);                               \
        ops[n].count = p->h->tensor_elems;                                      \
        ops[n].dtype = p->h->tensor_dtype;                                      \
        ops[n].peer = (peer_rank);                                              \
        ops[n].tag = (tag_value);                                               \
        n++;                                                                    \
    } while (0)
    if (send_prev) MC__P2P_OP(1, send_prev, p->prev, MC_SCHEDULE_TAG_BACKWARD);
    if (from_prev) MC__P2P_OP(0, from_prev, p->prev, MC_SCHEDULE_TAG_FORWARD);
    if (send_next) MC__P2P_OP(1, send_next, p->next, MC_SCHEDULE_TAG_FORWARD);
    if (from_next) MC__P2P_OP(0, from_next, p->next, MC_SCHEDULE_TAG_BACKWARD);
#undef MC__P2P_OP
    rc = n > 0 ? mc_batch_send_recv(p->pp_comm, ops, n) : MC_OK;
    if (rc != MC_OK) {
        mc__pipe_release(p, &from_prev);
        mc__pipe_release(p, &from_next);
        return rc;
    }
    if (from_prev)
        p->input[mc__pipe_slot(p, recv_prev_chunk, p->n_inputs[recv_prev_chunk]++)] = from_prev;
    if (from_next)
        p->out_grad[mc__pipe_slot(p, recv_next_chunk, p->n_grads[recv_next_chunk]++)] = from_next;
    return MC_OK;
}

/* The next op of this stage must be mc_schedule_ops' next one. */
static int mc__pipe_expect(mc__pipe *p, char kind, int mb, int chunk) {
    const mc_sched_op *e = p->n_checked < p->n_expect ? &p->expect[p->n_checked] : NULL;
    if (!e || e->kind != kind || e->microbatch != mb || e->chunk != chunk) {
        char want[32];
        if (e) snprintf(want, sizeof want, "%c%d.%d", e->kind, e->microbatch, e->chunk);
        else snprintf(want, sizeof want, "no op (it lists %d)", p->n_expect);
        return MC__FAIL(MC_ERR_STATE, "schedule: pp rank %d %s %c%d.%d as op %d, but "
                        "mc_schedule_ops lists %s there: the executor does not follow the op "
                        "table (refused before any P2P)", p->rank,
                        p->dry ? "would run" : "is about to run", kind, mb, chunk, p->n_checked,
                        want);
    }
    p->n_checked++;
    return MC_OK;
}

static void mc__pipe_trace(mc__pipe *p, char kind, int mb, int chunk) {
    if (p->res->n_ops < MC_SCHEDULE_TRACE_MAX) {
        mc_sched_op *op = &p->res->ops[p->res->n_ops];
        op->kind = kind;
        op->microbatch = mc__pipe_app_mb(p, mb);
        op->chunk = chunk;
        if (p->h->clock) p->res->op_start[p->res->n_ops] = p->h->clock(p->h->app);
    }
    p->res->n_ops++;
    p->tl_op = MC__TL_ON ? mc__tl_open(MC_TIMELINE_COMPUTE, kind == 'F' ? "forward" : "backward",
                                       mc__pipe_app_mb(p, mb), chunk, NULL, 0, 1)
                         : -1;
}

/* The end time of the op traced last (its hook has just returned). */
static void mc__pipe_trace_end(mc__pipe *p, int rc) {
    int i = p->res->n_ops - 1;
    if (p->h->clock && i >= 0 && i < MC_SCHEDULE_TRACE_MAX)
        p->res->op_end[i] = p->h->clock(p->h->app);
    if (p->tl_op >= 0) mc__tl_close(p->tl_op, rc, p->ops, NULL);
    p->tl_op = -1;
}

/* Forward of virtual micro-batch k. *output: what to send next (NULL on the last virtual
   stage, which instead accumulates the loss). */
static int mc__pipe_forward(mc__pipe *p, int k, float **output) {
    int mb = p->mb_of[k], chunk = p->chunk_of[k], slot = mc__pipe_slot(p, chunk, mb), rc;
    int first = mc__pipe_first_virtual(p, chunk), last = mc__pipe_last_virtual(p, chunk);
    double loss = 0.0, tokens = 0.0;
    float *out = NULL;
    if ((rc = mc__pipe_expect(p, 'F', mb, chunk)) != MC_OK) return rc;
    if (p->dry) {   /* any non-NULL pointer: the dry run only walks the sends */
        *output = last ? NULL : (float *)p;
        return MC_OK;
    }
    if (!first && !p->input[slot])
        return MC__FAIL(MC_ERR_STATE, "schedule: pp rank %d has no input for the forward of "
                        "micro-batch %d on chunk %d", p->rank, mb, chunk);
    mc__pipe_trace(p, 'F', mb, chunk);
    rc = p->h->forward_step(p->h->app, chunk, mc__pipe_app_mb(p, mb),
                            first ? NULL : p->input[slot], &out, &loss, &tokens);
    if (rc == MC_OK && last && p->h->loss_func) {   /* only the last stage interprets output */
        loss = tokens = 0.0;
        rc = p->h->loss_func(p->h->app, mc__pipe_app_mb(p, mb), out, &loss, &tokens);
    }
    mc__pipe_trace_end(p, rc);   /* the forward op ends with its loss */
    if (rc != MC_OK) return rc;
    if (last) {
        p->res->loss_sum += loss;
        p->res->num_tokens += tokens;
        p->tokens[mb] = tokens;
        out = NULL;
    } else if (!out) {
        return MC__FAIL(MC_ERR_STATE, "schedule: forward_step of micro-batch %d on chunk %d "
                        "(virtual stage %d) returned no output to send", mb, chunk,
                        chunk * p->pp + p->rank);
    }
    if (p->forward_only) mc__pipe_release(p, &p->input[slot]);
    *output = out;
    return MC_OK;
}

/* Backward of virtual micro-batch k (chunk mirrored). Grad sync is on for exactly the backward
   of a chunk's last micro-batch. *input_grad: what to send back (NULL on the first virtual
   stage). */
static int mc__pipe_backward(mc__pipe *p, int k, float **input_grad) {
    int chunk = mc__pipe_chunk(p, k, 0), mb = p->mb_of[k], slot = mc__pipe_slot(p, chunk, mb);
    int first = mc__pipe_first_virtual(p, chunk), last = mc__pipe_last_virtual(p, chunk);
    int last_mb = mb == p->m - 1, rc;
    float *grad = NULL, scale = 1.0f;
    if ((rc = mc__pipe_expect(p, 'B', mb, chunk)) != MC_OK) return rc;
    if (p->dry) {
        *input_grad = first ? NULL : (float *)p;
        return MC_OK;
    }
    if (!last && !p->out_grad[slot])
        return MC__FAIL(MC_ERR_STATE, "schedule: pp rank %d has no output gradient for the "
                        "backward of micro-batch %d on chunk %d", p->rank, mb, chunk);
    if (last) {
        /* Megatron's loss_func 3-tuple: loss / max(num_tokens, 1) / num_microbatches. */
        double tokens = p->tokens[mb] > 1.0 ? p->tokens[mb] : 1.0;
        scale = (float)(1.0 / (tokens * (double)mc__pipe_caller_m(p)));
    }
    if (last_mb && p->h->grad_sync) {
        p->h->grad_sync(p->h->app, chunk, 1);
        mc_timeline_mark("grad_sync_on", chunk);
    }
    mc__pipe_trace(p, 'B', mb, chunk);
    rc = p->h->backward_step(p->h->app, chunk, mc__pipe_app_mb(p, mb),
                             last ? NULL : p->out_grad[slot], scale, &grad);
    mc__pipe_trace_end(p, rc);
    if (last_mb && p->h->grad_sync) p->h->grad_sync(p->h->app, chunk, 0);
    if (rc != MC_OK) return rc;
    mc__pipe_release(p, &p->input[slot]);
    mc__pipe_release(p, &p->out_grad[slot]);
    if (first) grad = NULL;
    else if (!grad)
        return MC__FAIL(MC_ERR_STATE, "schedule: backward_step of micro-batch %d on chunk %d "
                        "(virtual stage %d) returned no input gradient to send", mb, chunk,
                        chunk * p->pp + p->rank);
    *input_grad = grad;
    return MC_OK;
}

/* Checks the arguments, resolves the schedule (mc_schedule_ops' validation gives Megatron's
   rules) and allocates the run. `vpp` is 1 unless interleaved. */
static int mc__pipe_init(mc__pipe *p, const mc_parallel_state *ps, const mc_schedule_hooks *h,
                         int m, int forward_only, mc_schedule_result *res, int vpp,
                         const char *fn) {
    mc_schedule_desc d;
    int rc, slots, k;
    memset(p, 0, sizeof *p);
    if (!ps || !ps->initialized)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: the parallel state is %s", fn,
                        ps ? "not initialized" : "NULL");
    if (!h || !h->forward_step)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: hooks%s is NULL", fn, h ? "->forward_step" : "");
    if (!forward_only && !h->backward_step)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: hooks->backward_step is NULL but forward_only "
                        "is 0", fn);
    if (!res) return MC__FAIL(MC_ERR_INVALID_ARG, "%s: result is NULL", fn);
    memset(res, 0, sizeof *res);
    p->h = h;
    p->res = res;
    p->dropped = -1;
    p->ops = mc_comm_memory(ps->world);
    p->tl_op = -1;
#if defined(MC_FAULT_HOOKS)
    if (mc__fault_drop >= 0 && mc__fault_drop < m && m > 1 && vpp <= 1) {
        p->dropped = mc__fault_drop;
        m--;   /* from here on the executor believes it was asked for M - 1 */
    }
#endif
    p->pp_comm = mc_parallel_group(ps, MC_GROUP_PP);
    p->pp = p->pp_comm ? p->pp_comm->size : 1;
    p->rank = p->pp_comm ? p->pp_comm->rank : 0;
    p->prev = (p->rank + p->pp - 1) % p->pp;
    p->next = (p->rank + 1) % p->pp;
    p->forward_only = forward_only != 0;
    if (p->pp > 1 && h->tensor_elems == 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: hooks->tensor_elems is 0, but pipeline stages "
                        "(PP = %d) exchange tensors of that many floats", fn, p->pp);
    memset(&d, 0, sizeof d);
    d.pp = p->pp;
    d.pp_rank = p->rank;
    d.num_microbatches = m;
    d.vpp = vpp > 1 ? vpp : 0;
    d.group_size = h->group_size;
    d.forward_only = forward_only;
    if ((rc = mc_schedule_ops(&d, NULL, 0, &p->warmup)) < 0) return rc;
    p->n_expect = rc;
    p->m = m;
    p->v = vpp > 1 ? vpp : 1;
    p->total = m * p->v;
    slots = p->total;
    p->mb_of = (int *)mc_calloc((size_t)slots, sizeof(int));
    p->chunk_of = (int *)mc_calloc((size_t)slots, sizeof(int));
    p->input = (float **)mc_calloc((size_t)slots, sizeof(float *));
    p->out_grad = (float **)mc_calloc((size_t)slots, sizeof(float *));
    p->spare = (float **)mc_calloc((size_t)slots * 2, sizeof(float *));
    p->n_inputs = (int *)mc_calloc((size_t)p->v, sizeof(int));
    p->n_grads = (int *)mc_calloc((size_t)p->v, sizeof(int));
    p->tokens = (double *)mc_calloc((size_t)m, sizeof(double));
    p->expect = (mc_sched_op *)mc_calloc((size_t)(p->n_expect ? p->n_expect : 1),
                                         sizeof(mc_sched_op));
    if (!p->mb_of || !p->chunk_of || !p->input || !p->out_grad || !p->spare || !p->n_inputs ||
        !p->n_grads || !p->tokens || !p->expect) {
        mc__pipe_free(p);
        return MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory for M x V = %d slots", fn, slots);
    }
    if (p->v > 1) mc_schedule_table(&d, p->mb_of, p->chunk_of, slots);
    else
        for (k = 0; k < slots; k++) p->mb_of[k] = k;
    mc_schedule_ops(&d, p->expect, p->n_expect, NULL);
    res->n_warmup = p->warmup;
    return MC_OK;
}

/* Runs `run` once dry (its op order against mc_schedule_ops, nothing computed or sent), then
   for real, re-checking each op. */
static int mc__pipe_checked_run(mc__pipe *p, int (*run)(mc__pipe *)) {
    int rc;
    p->dry = 1;
    p->n_checked = 0;
    rc = run(p);
    if (rc == MC_OK && p->n_checked != p->n_expect)
        rc = MC__FAIL(MC_ERR_STATE, "schedule: pp rank %d would run %d ops, but mc_schedule_ops "
                      "lists %d: the executor does not follow the op table (refused before "
                      "any P2P)", p->rank, p->n_checked, p->n_expect);
    p->dry = 0;
    p->n_checked = 0;
    return rc == MC_OK ? run(p) : rc;
}

/* Megatron's disable_grad_sync at entry (every chunk), then the run, then finalize. */
static int mc__pipe_finish(mc__pipe *p, int rc) {
    int i, left = 0;
    for (i = 0; rc == MC_OK && i < p->v * p->m; i++) left += p->input[i] || p->out_grad[i];
    if (rc == MC_OK && left)
        rc = MC__FAIL(MC_ERR_STATE, "schedule: pp rank %d received %d tensors it never used",
                      p->rank, left);
    if (rc == MC_OK && !p->forward_only && p->h->finalize) rc = p->h->finalize(p->h->app);
    mc__pipe_free(p);
    return rc;
}

static void mc__pipe_sync_off(mc__pipe *p) {
    int c;
    if (p->forward_only || !p->h->grad_sync) return;
    for (c = 0; c < p->v; c++) p->h->grad_sync(p->h->app, c, 0);
}

/* Megatron's P2P helpers of the non-interleaved schedule (V = 1): no-ops on the first stage
   (recv_forward, send_backward) and on the last one (send_forward, recv_backward). */
static int mc__pipe_recv_forward(mc__pipe *p) {
    return p->rank == 0 ? MC_OK : mc__pipe_communicate(p, NULL, NULL, 0, -1);
}
static int mc__pipe_send_forward(mc__pipe *p, const float *out) {
    return p->rank == p->pp - 1 ? MC_OK : mc__pipe_communicate(p, out, NULL, -1, -1);
}
static int mc__pipe_recv_backward(mc__pipe *p) {
    return p->rank == p->pp - 1 ? MC_OK : mc__pipe_communicate(p, NULL, NULL, -1, 0);
}
static int mc__pipe_send_backward(mc__pipe *p, const float *grad) {
    return p->rank == 0 ? MC_OK : mc__pipe_communicate(p, NULL, grad, -1, -1);
}
static int mc__pipe_send_forward_recv_backward(mc__pipe *p, const float *out) {
    return p->rank == p->pp - 1 ? MC_OK : mc__pipe_communicate(p, out, NULL, -1, 0);
}
static int mc__pipe_send_backward_recv_forward(mc__pipe *p, const float *grad) {
    return p->rank == 0 ? MC_OK : mc__pipe_communicate(p, NULL, grad, 0, -1);
}

MC_API int mc_forward_backward_no_pipelining(const mc_parallel_state *ps,
                                             const mc_schedule_hooks *hooks, int num_microbatches,
                                             int forward_only, mc_schedule_result *result) {
    mc__pipe p;
    float *out = NULL, *grad = NULL;
    int rc, i;
    if (ps && ps->initialized && mc_parallel_size(ps, MC_GROUP_PP) > 1)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_forward_backward_no_pipelining: the pipeline-model-"
                        "parallel size is %d; no pipelining needs 1 (use "
                        "mc_get_forward_backward_func)", mc_parallel_size(ps, MC_GROUP_PP));
    rc = mc__pipe_init(&p, ps, hooks, num_microbatches, forward_only, result, 1,
                       "mc_forward_backward_no_pipelining");
    if (rc != MC_OK) return rc;
    mc__pipe_sync_off(&p);
    /* Megatron runs micro-batches 0..M-2 inside no_sync and the last one outside it; the
       switch sits in mc__pipe_backward. */
    for (i = 0; i < p.m && rc == MC_OK; i++) {
        rc = mc__pipe_forward(&p, i, &out);
        if (rc == MC_OK && !p.forward_only) rc = mc__pipe_backward(&p, i, &grad);
    }
    return mc__pipe_finish(&p, rc);
}

/* 1F1B, section 8.4: warmup forwards, the steady 1F1B pairs with combined exchanges, the
   cooldown backwards. */
static int mc__pipe_run_1f1b(mc__pipe *p) {
    int w = p->warmup, remaining, i, rc = MC_OK;
    float *out = NULL, *grad = NULL;
#if defined(MC__SCHEDULE_FAULT)
    /* Tests only (tests/mpi_cases/sched_fault_cases.c): one warmup forward too many, the
       classic 1F1B bug, which the op-table check must refuse before any P2P. */
    if (w < p->m) w++;
#endif
    remaining = p->m - w;
    for (i = 0; i < w && rc == MC_OK; i++) {
        if ((rc = mc__pipe_recv_forward(p)) != MC_OK) break;
        if ((rc = mc__pipe_forward(p, i, &out)) != MC_OK) break;
        rc = mc__pipe_send_forward(p, out);
    }
    if (rc == MC_OK && remaining > 0) rc = mc__pipe_recv_forward(p);
    for (i = 0; i < remaining && rc == MC_OK; i++) {
        int last_iteration = i == remaining - 1;
        if ((rc = mc__pipe_forward(p, w + i, &out)) != MC_OK) break;
        if (p->forward_only) {
            if ((rc = mc__pipe_send_forward(p, out)) != MC_OK) break;
            if (!last_iteration) rc = mc__pipe_recv_forward(p);
            continue;
        }
        if ((rc = mc__pipe_send_forward_recv_backward(p, out)) != MC_OK) break;
        if ((rc = mc__pipe_backward(p, i, &grad)) != MC_OK) break;
        rc = last_iteration ? mc__pipe_send_backward(p, grad)
                            : mc__pipe_send_backward_recv_forward(p, grad);
    }
    for (i = 0; i < w && rc == MC_OK && !p->forward_only; i++) {
        if ((rc = mc__pipe_recv_backward(p)) != MC_OK) break;
        if ((rc = mc__pipe_backward(p, remaining + i, &grad)) != MC_OK) break;
        rc = mc__pipe_send_backward(p, grad);
    }
    return rc;
}

MC_API int mc_forward_backward_pipelining_without_interleaving(
    const mc_parallel_state *ps, const mc_schedule_hooks *hooks, int num_microbatches,
    int forward_only, mc_schedule_result *result) {
    mc__pipe p;
    int rc;
    if (ps && ps->initialized && ps->grid.desc.vpp > 1)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_forward_backward_pipelining_without_interleaving: "
                        "non-interleaved pipeline-parallel schedule does not support model "
                        "chunking (virtual pipeline size %d)", ps->grid.desc.vpp);
    rc = mc__pipe_init(&p, ps, hooks, num_microbatches, forward_only, result, 1,
                       "mc_forward_backward_pipelining_without_interleaving");
    if (rc != MC_OK) return rc;
    mc__pipe_sync_off(&p);
    return mc__pipe_finish(&p, mc__pipe_checked_run(&p, mc__pipe_run_1f1b));
}

/* Megatron's recv_tensor_from_previous_stage: whether this stage receives a tensor in the
   exchange after virtual micro-batch k, and for which chunk. The leading stage (pp rank 0 for
   activations, P-1 for gradients) receives what the other end of the pipeline produced
   P-1 virtual micro-batches earlier, through the cyclic link, for the neighbouring chunk. */
static int mc__pipe_recv_chunk(const mc__pipe *p, int k, int forward) {
    int leading = forward ? p->rank == 0 : p->rank == p->pp - 1;
    int edge_chunk = forward ? p->v - 1 : 0, step = forward ? 1 : -1, c;
    if (!leading) return mc__pipe_chunk(p, k + 1, forward);
    if (k < p->pp - 1) return -1;   /* the other end has produced nothing yet */
    c = mc__pipe_chunk(p, k - (p->pp - 1), forward);
    return c == edge_chunk ? -1 : c + step;   /* the last chunk leaves the pipeline */
}

/* Interleaved 1F1B, section 8.5 (batched P2P, no overlap). */
static int mc__pipe_run_interleaved(mc__pipe *p) {
    int total = p->total, w = p->warmup, remaining = total - w, all_warmup = w == total;
    int first_pp = p->rank == 0, last_pp = p->rank == p->pp - 1, k, rc = MC_OK;
    float *out = NULL, *grad = NULL;
    if (!first_pp) rc = mc__pipe_communicate(p, NULL, NULL, 0, -1);   /* recv_forward, chunk 0 */
    for (k = 0; k < w && rc == MC_OK; k++) {
        int recv_prev = k == total - 1 ? -1 : mc__pipe_recv_chunk(p, k, 1);
        if ((rc = mc__pipe_forward(p, k, &out)) != MC_OK) break;
        if (k == w - 1 && !p->forward_only && !all_warmup)
            /* the last warmup exchange also fetches the first backward's gradient */
            rc = mc__pipe_communicate(p, out, NULL, recv_prev, last_pp ? -1 : p->v - 1);
        else
            rc = mc__pipe_communicate(p, out, NULL, recv_prev, -1);   /* send_forward_recv_forward */
    }
    for (k = 0; k < remaining && rc == MC_OK; k++) {
        int forward_k = k + w, recv_prev, recv_next;
        if ((rc = mc__pipe_forward(p, forward_k, &out)) != MC_OK) break;
        if ((rc = mc__pipe_backward(p, k, &grad)) != MC_OK) break;
        recv_prev = k == remaining - 1 ? -1 : mc__pipe_recv_chunk(p, forward_k, 1);
        recv_next = mc__pipe_recv_chunk(p, k, 0);
        rc = mc__pipe_communicate(p, out, grad, recv_prev, recv_next);
    }
    if (p->forward_only) return rc;
    if (rc == MC_OK && all_warmup && !last_pp)   /* recv_backward for chunk V-1 */
        rc = mc__pipe_communicate(p, NULL, NULL, -1, p->v - 1);
    for (k = remaining; k < total && rc == MC_OK; k++) {
        int recv_next = k == total - 1 ? -1 : mc__pipe_recv_chunk(p, k, 0);
        if ((rc = mc__pipe_backward(p, k, &grad)) != MC_OK) break;
        rc = mc__pipe_communicate(p, NULL, grad, -1, recv_next);   /* send_backward_recv_backward */
    }
    return rc;
}

MC_API int mc_forward_backward_pipelining_with_interleaving(
    const mc_parallel_state *ps, const mc_schedule_hooks *hooks, int num_microbatches,
    int forward_only, mc_schedule_result *result) {
    mc__pipe p;
    int rc, vpp = ps && ps->initialized ? ps->grid.desc.vpp : 0;
    if (ps && ps->initialized && vpp <= 1)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_forward_backward_pipelining_with_interleaving: "
                        "interleaved pipeline parallelism expected model chunking, but the "
                        "virtual pipeline size is %d (set mc_grid_desc.vpp >= 2)", vpp);
    rc = mc__pipe_init(&p, ps, hooks, num_microbatches, forward_only, result, vpp,
                       "mc_forward_backward_pipelining_with_interleaving");
    if (rc != MC_OK) return rc;
    mc__pipe_sync_off(&p);
    return mc__pipe_finish(&p, mc__pipe_checked_run(&p, mc__pipe_run_interleaved));
}

MC_API mc_forward_backward_func mc_get_forward_backward_func(const mc_parallel_state *ps) {
    if (!ps) return NULL;
    if (ps->grid.desc.pp > 1)
        return ps->grid.desc.vpp > 1 ? mc_forward_backward_pipelining_with_interleaving
                                     : mc_forward_backward_pipelining_without_interleaving;
    return mc_forward_backward_no_pipelining;
}

/* @schedules:implementation end */

/* =============================================================================================
   transformer and models.gpt (implementation) */

/* @model:implementation begin */

// ---------------------------------------------------------------------------------------------
// >>transformer and >>models.gpt: the local spec, the layer and the block, then GPTModel
// (declarations and the shape legend at >>models.gpt above)

#include <math.h>   /* defines: sqrt, log (init scale) */

/* (seed, offset, p) of one dropout: p == 0 means off (no draw was made). */
typedef struct mc__gpt_draw {
    uint64_t seed, offset;
    float p;
} mc__gpt_draw;

/* Activations are op memory of the model's dtype (void *), statistics fp32 (float *). */
struct mc__gpt_layer_cache {
    void *ln1;                   /* (Ns, H) input_layernorm output */
    float *ln1_mean, *ln1_rstd;  /* (Ns) */
    void *qkv;                   /* (N, 3*Ql) per-head [q|k|v] */
    void *atty;                  /* (N, Ql) core attention output */
    float *attn_stats;           /* ops->attention_stats() floats (the CPU: the probabilities
                                    (B, NHl, S, S)); NULL under selective recompute when the
                                    backend's stats are the probabilities */
    void *res1;                  /* (Ns, H) x + dropout(attention) */
    void *ln2;                   /* (Ns, H) pre_mlp_layernorm output */
    float *ln2_mean, *ln2_rstd;  /* (Ns) */
    void *fc1;                   /* (N, Fl) before GELU */
    void *gelu;                  /* (N, Fl) */
    void *attention;             /* a spec's own attention: its attention_cache_bytes (then
                                    qkv, atty and attn_stats are not allocated) */
    mc__gpt_draw attn_drop, drop1, drop2;
};

/* The saved activations of one micro-batch slot of one chunk: one arena (op memory), its
   tensors laid out once at init (llm.c's malloc_and_point_activations). */
typedef struct mc__gpt_act {
    int microbatch;              /* held micro-batch (-1: none); set by forward_step */
    int forward_done;            /* forward ran and backward has not */
    int has_labels;
    void *arena;                 /* the one allocation behind every tensor below */
    void **res;                  /* (nl + 1) pointers to (Ns, H): res[l] is layer l's input,
                                    res[nl] the block output; inside a recompute group they
                                    point into the shared recompute scratch */
    struct mc__gpt_layer_cache *layer;   /* (nl) caches of the layers that are not recomputed */
    mc_rng_states *group_rng;    /* (n_groups) stream snapshots before each recompute group */
    void *dinput;                /* (Ns, H) grad of res[0] (what backward hands back) */
    /* pre_process */
    int *tokens;                 /* (N) uploaded from the caller's host array */
    mc__gpt_draw emb_drop;
    /* post_process */
    int *labels;                 /* (N) */
    void *lnf;                   /* (Ns, H) final_layernorm output */
    float *lnf_mean, *lnf_rstd;  /* (Ns) */
    void *logits;                /* (N, Vl) */
    float *ce_max, *ce_sum;      /* (N) global row max and sum of exp(logit - max) */
    float *losses;               /* (N) */
    double *loss_sum;            /* (1) sum of the losses, read back only when asked */
} mc__gpt_act;

struct mc__gpt_impl {
    void **host;                 /* host bookkeeping mc_gpt_destroy releases */
    int n_host, cap_host;
    /* the submodules every layer runs: the given spec, with the local attention in place of
       a spec's own when that refused the shape (gpt->attention_fallback) */
    mc_transformer_spec spec;
    int own_attention;           /* the spec's own attention runs */
    size_t attention_cache_bytes, attention_scratch_bytes;
    void *attention_scratch;     /* (attention_scratch_bytes) in the scratch arena */
    /* parameter indices: -1 where absent on this rank */
    int word[MC_GPT_MAX_CHUNKS], pos[MC_GPT_MAX_CHUNKS];
    int lnf_w[MC_GPT_MAX_CHUNKS], lnf_b[MC_GPT_MAX_CHUNKS], out_w[MC_GPT_MAX_CHUNKS];
    int *layer_params;           /* (n_chunks, nl, MC_GPT_LAYER_TENSORS) */
    /* recompute groups of a chunk (the same for every chunk): group_of[l] = -1 when layer l
       is not recomputed; group g covers [group_start[g], group_start[g] + group_len[g]) */
    int *group_of, *group_start, *group_len;
    int n_groups, max_group;
    int selective;
    int keep_stats;              /* layer caches hold attention stats (not selective, or stats
                                    that are not the probabilities) */
    mc__gpt_act *act;            /* (n_chunks, n_slots) */
    /* shared scratch: one arena */
    void *scratch_arena;
    size_t arena_bytes;          /* all arenas together (reported by mc_gpt_memory) */
    struct mc__gpt_layer_cache *rc_cache;   /* (max_group) caches for recomputed layers */
    void **rc_res;               /* (max_group) interior residuals of a group */
    float *stats_scratch;        /* attention stats for selective recompute */
    void *atty_scratch;          /* (N, Ql) selective recompute output (discarded) */
    void *full_a, *full_b;       /* (N, H) embedding sums / gathered inputs */
    void *tmp_a, *tmp_b;         /* (Ns, H) sub-module outputs before dropout */
    void *d_a, *d_b, *d_c;       /* (Ns, H) backward residual-stream grads */
    void *d_ln;                  /* (Ns, H) grad of a norm output */
    void *d_qkv;                 /* (N, 3*Ql) */
    void *d_atty;                /* (N, Ql) */
    void *d_fc_a, *d_fc_b;       /* (N, Fl) */
    void *d_logits;              /* (N, Vl) */
    float *d_loss;               /* (N) */
    void *tp_scratch;            /* scratch of the tensor-parallel layers (their _scratch()) */
    int *pos_ids;                /* (N) position of each token: s, uploaded at init */
    int replaying;               /* 1 while a full-recompute group re-runs its forward */
    int tap_slot, tap_microbatch;   /* tensor taps: the call in progress (slot, micro-batch) */
};

#define MC__GPT_LN_EPS(g) ((g)->config.layernorm_epsilon)

/* Remembers a host block for mc_gpt_destroy. */
static int mc__gpt_track(mc_gpt *g, void *p) {
    struct mc__gpt_impl *im = g->impl;
    if (im->n_host == im->cap_host) {
        int cap = im->cap_host ? 2 * im->cap_host : 64;
        void **grown = (void **)mc_malloc((size_t)cap * sizeof *grown);
        if (!grown) return MC_ERR_NO_MEMORY;
        if (im->n_host) memcpy(grown, im->host, (size_t)im->n_host * sizeof *grown);
        mc_free(im->host);
        im->host = grown;
        im->cap_host = cap;
    }
    im->host[im->n_host++] = p;
    return MC_OK;
}

/* zero-filled host memory (pointer arrays, stream snapshots) */
static void *mc__gpt_host(mc_gpt *g, size_t bytes) {
    void *p = mc_calloc(1, bytes ? bytes : 1);
    if (p && mc__gpt_track(g, p) != MC_OK) {
        mc_free(p);
        return NULL;
    }
    return p;
}

/* A bump allocator over one block of op memory. The layout functions run twice: first with
   base == NULL to add up the bytes (every take returns NULL), then over the allocated block
   with the same calls, which hand out the same offsets. */
typedef struct mc__arena {
    char *base;
    size_t used;
} mc__arena;

#define MC__ARENA_ALIGN 256   /* every tensor starts 256-byte aligned (vector loads, cuBLASLt) */

static void *mc__arena_take(mc__arena *ar, size_t bytes) {
    size_t at = (ar->used + (MC__ARENA_ALIGN - 1)) & ~(size_t)(MC__ARENA_ALIGN - 1);
    ar->used = at + (bytes ? bytes : 1);
    return ar->base ? ar->base + at : NULL;
}

/* n activation elements (the model's dtype) / fp32 / int32 */
static void *mc__gpt_act_take(mc_gpt *g, mc__arena *ar, size_t n) {
    return mc__arena_take(ar, mc_dtype_bytes(g->dtype, n));
}
static float *mc__gpt_f32_take(mc__arena *ar, size_t n) {
    return (float *)mc__arena_take(ar, n * sizeof(float));
}

static mc_comm *mc__gpt_group(const mc_gpt *g, mc_group_kind kind) {
    return g->ps ? mc_parallel_group(g->ps, kind) : NULL;
}

static mc_comm *mc__gpt_tp_comm(const mc_gpt *g) {
    mc_comm *c = mc__gpt_group(g, MC_GROUP_TP);
    return c && c->size > 1 ? c : NULL;
}

/* element i of an activation tensor */
static void *mc__gpt_at(const mc_gpt *g, const void *p, size_t i) {
    return (char *)(uintptr_t)p + mc_dtype_bytes(g->dtype, i);
}

// ---------------------------------------------------------------------------------------------
// tensor taps (>>models.gpt.taps)

/* A tap tensor: an activation of the model's dtype, rows x cols, row_shard when its rows are
   the sequence piece of this rank (SP), col_shard when its columns are the vocab piece. */
static mc_gpt_tap_tensor mc__gpt_tt(const mc_gpt *g, const void *data, mc_dtype dt, int rows,
                                   int cols, int col_shard) {
    mc_gpt_tap_tensor t;
    t.data = data;
    t.dtype = dt;
    t.rows = rows;
    t.cols = cols;
    t.row_shard = data && rows == g->Ns && g->sequence_parallel && g->tp > 1;
    t.col_shard = data && col_shard && g->tp > 1;
    return t;
}

/* [Ns, H] in the model's dtype (the residual stream and the norm outputs) */
static mc_gpt_tap_tensor mc__gpt_tt_hidden(const mc_gpt *g, const void *data) {
    return mc__gpt_tt(g, data, g->dtype, g->Ns, g->H, 0);
}

static const mc_gpt_tap_tensor mc__gpt_tt_none = {NULL, MC_F32, 0, 0, 0, 0};

/* Calls the tap for module `name` (a printf format with one %d for the global layer, or a
   plain name when layer < 0). */
static void mc__gpt_tap(mc_gpt *g, int chunk, const char *name, int layer, int backward,
                        mc_gpt_tap_tensor in, mc_gpt_tap_tensor out) {
    char module[MC_PARAM_NAME_MAX];
    mc_gpt_tap t;
    if (!g->tap || g->impl->replaying) return;
    if (layer >= 0)
        snprintf(module, sizeof module, name, layer);
    else
        snprintf(module, sizeof module, "%s", name);
    t.module = module;
    t.backward = backward;
    t.chunk = chunk;
    t.slot = g->impl->tap_slot;
    t.microbatch = g->impl->tap_microbatch;
    t.layer = layer;
    t.in = in;
    t.out = out;
    g->tap(g->tap_user, &t);
}

// ---------------------------------------------------------------------------------------------
// faults (>>core.faults): the model's part

#define MC__GPT_ATTENTION 0   /* the submodules, numbered as MC_FAULT_ATTENTION / MC_FAULT_MLP */
#define MC__GPT_MLP 1

/* TP flags of the fault set for this layer's submodule: the row-parallel layer's forward
   (backward == 0) or the column-parallel layer's backward (backward == 1). */
static int mc__gpt_fault_flags(const mc_layer_ctx *ctx, int submodule, int backward) {
#if defined(MC_FAULT_HOOKS)
    if (!backward && mc__fault_at(MC_FAULT_ROW_NO_REDUCE, ctx->global_layer, submodule))
        return MC__TP_FAULT_NO_REDUCE;
    if (backward && mc__fault_at(MC_FAULT_COLUMN_NO_DGRAD_REDUCE, ctx->global_layer, submodule))
        return MC__TP_FAULT_NO_DGRAD_REDUCE;
#endif
    (void)ctx;
    (void)submodule;
    (void)backward;
    return 0;
}

#if defined(MC_FAULT_HOOKS)
/* qkv (N, 3 Ql) [q|k|v] per head: every q (q_only) or every element times f. */
static int mc__gpt_fault_scale_qkv(mc_gpt *g, void *qkv, float f, int q_only) {
    const mc_ops *o = g->ops;
    size_t es = mc_dtype_bytes(g->dtype, 1), hd = (size_t)g->HD, pitch = 3 * (size_t)g->Ql * es;
    void *tmp;
    int h, rc = MC_OK;
    if (!q_only) return o->scale(o, qkv, f, (size_t)g->N * 3 * (size_t)g->Ql, g->dtype);
    if (!(tmp = mc__ops_alloc(o, MC_MEMORY_ACTIVATIONS, (size_t)g->N * hd * es)))
        return MC_ERR_NO_MEMORY;
    for (h = 0; rc == MC_OK && h < g->NHl; h++) {
        char *q = (char *)qkv + (size_t)h * 3 * hd * es;   /* head h's q columns */
        rc = o->copy_2d(o, tmp, hd * es, q, pitch, hd * es, (size_t)g->N);
        if (rc == MC_OK) rc = o->scale(o, tmp, f, (size_t)g->N * hd, g->dtype);
        if (rc == MC_OK) rc = o->copy_2d(o, q, pitch, tmp, hd * es, hd * es, (size_t)g->N);
    }
    mc__ops_free(o, tmp);
    return rc;
}

/* MC_FAULT_QKV_SHARD on this rank and layer: the linear_qkv output (forward) and, in backward,
   the grad reaching the linear (d raw = factor x d corrupted) are multiplied by the factor. */
static int mc__gpt_fault_qkv_shard(const mc_layer_ctx *ctx, void *qkv) {
    mc_gpt *g = ctx->gpt;
    if (mc__fault.kind != MC_FAULT_QKV_SHARD || mc__fault.layer != ctx->global_layer ||
        g->tp_rank != mc__fault.tp_rank)
        return MC_OK;
    return mc__gpt_fault_scale_qkv(g, qkv, mc__fault.factor, 0);
}

/* MC_FAULT_SOFTMAX_SCALE in this layer: core attention runs on q times the factor (times
   1 / factor to undo it afterwards, so the cache keeps linear_qkv's output), and d q is
   multiplied by the factor. */
static int mc__gpt_fault_softmax(const mc_layer_ctx *ctx, void *buf, float power) {
    if (mc__fault.kind != MC_FAULT_SOFTMAX_SCALE || mc__fault.layer != ctx->global_layer)
        return MC_OK;
    return mc__gpt_fault_scale_qkv(ctx->gpt, buf, power > 0 ? mc__fault.factor
                                                             : 1.0f / mc__fault.factor, 1);
}
#endif

// ---------------------------------------------------------------------------------------------
// TP glue: the model's calls into the tensor-parallel layers (>>tensor_parallel), which hold
// the communication; sizes here are the model's local ones.

static int mc__gpt_tp_flags(const mc_gpt *g) {
    return g->sequence_parallel ? MC_TP_SEQUENCE_PARALLEL : 0;
}

/* ColumnParallelLinear: out (N, O) = X W^T + b with W (O, K) this rank's rows; X (Ns, K) is
   gathered along the sequence inside under SP. */
static int mc__gpt_column_forward(mc_gpt *g, void *out, const void *in, const void *w,
                                  const void *b, int O, int K) {
    return mc_column_parallel_linear_forward(out, g->impl->tp_scratch, in, w, b, g->S, g->B, K,
                                             O * g->tp, mc__gpt_tp_flags(g), g->dtype,
                                             mc__gpt_tp_comm(g), g->ops);
}

/* din (Ns, K) (=), dW += dY^T X, db += column sums of dY; fault: mc__gpt_fault_flags */
static int mc__gpt_column_backward(mc_gpt *g, void *din, float *dw, float *db, const void *dout,
                                   const void *in, const void *w, int O, int K, int fault) {
    return mc_column_parallel_linear_backward(din, dw, db, g->impl->tp_scratch, dout, in, w,
                                              g->S, g->B, K, O * g->tp,
                                              mc__gpt_tp_flags(g) | fault, g->dtype,
                                              mc__gpt_tp_comm(g), g->ops);
}

/* RowParallelLinear with input_is_parallel: out (Ns, O) = sum over TP of X W^T, then the bias
   once; X (N, K) is this rank's slice of the input features, W (O, K); fault: as above. */
static int mc__gpt_row_forward(mc_gpt *g, void *out, const void *in, const void *w,
                               const void *b, int O, int K, int fault) {
    return mc_row_parallel_linear_forward(out, g->impl->tp_scratch, in, w, b, g->S, g->B,
                                          K * g->tp, O,
                                          mc__gpt_tp_flags(g) | MC_TP_INPUT_IS_PARALLEL | fault,
                                          g->dtype, mc__gpt_tp_comm(g), g->ops);
}

/* din (N, K) (=), dW +=, db += column sums of the local dout (partial under SP: finalize sums
   the sequence_parallel-tagged bias over TP) */
static int mc__gpt_row_backward(mc_gpt *g, void *din, float *dw, float *db, const void *dout,
                                const void *in, const void *w, int O, int K) {
    return mc_row_parallel_linear_backward(din, dw, db, g->impl->tp_scratch, dout, in, w, g->S,
                                           g->B, K * g->tp, O,
                                           mc__gpt_tp_flags(g) | MC_TP_INPUT_IS_PARALLEL,
                                           g->dtype, mc__gpt_tp_comm(g), g->ops);
}

/* Bytes of scratch the TP calls above need, the largest over the model's layers. */
static size_t mc__gpt_tp_scratch_bytes(const mc_gpt *g) {
    int f = mc__gpt_tp_flags(g), fr = f | MC_TP_INPUT_IS_PARALLEL;
    size_t need = 0, n;
#define MC__GPT_NEED(x) n = (x); if (n > need) need = n
    MC__GPT_NEED(mc_column_parallel_linear_scratch(g->S, g->B, g->H, 3 * g->Q, f, g->tp));
    MC__GPT_NEED(mc_column_parallel_linear_scratch(g->S, g->B, g->H, g->F, f, g->tp));
    MC__GPT_NEED(mc_column_parallel_linear_scratch(g->S, g->B, g->H, g->vocab_padded, f, g->tp));
    MC__GPT_NEED(mc_row_parallel_linear_scratch(g->S, g->B, g->Q, g->H, fr, g->tp));
    MC__GPT_NEED(mc_row_parallel_linear_scratch(g->S, g->B, g->F, g->H, fr, g->tp));
    need = mc_dtype_bytes(g->dtype, need);
    MC__GPT_NEED(sizeof(float) *
                 mc_vocab_parallel_cross_entropy_scratch(g->N, g->vocab_padded, 0.0f, g->tp));
#undef MC__GPT_NEED
    return need;
}

// ---------------------------------------------------------------------------------------------
// random streams

#if defined(MC_FAULT_HOOKS)
static char mc__fault_stream[MC_RNG_NAME_MAX];   /* "" = Megatron's rules */
static unsigned mc__fault_recompute;
MC_API void mc_fault_dropout_stream(const char *stream) {
    snprintf(mc__fault_stream, sizeof mc__fault_stream, "%s", stream ? stream : "");
}
MC_API void mc_fault_recompute_rng(unsigned flags) { mc__fault_recompute = flags; }
#define MC__FAULT_RECOMPUTE(flag) ((mc__fault_recompute & (flag)) != 0)
#else
#define MC__FAULT_RECOMPUTE(flag) 0
#endif

/* Takes (seed, offset) for n elements from `stream` (MC_RNG_DEFAULT or a tracker stream) and
   advances it, as a draw of n elements would. p <= 0 or eval mode: no dropout, no draw.
   site, chunk and layer only label the draw for the dropout_drawn tap. */
static int mc__gpt_draw_from(mc_gpt *g, mc_gpt_dropout_site site, int chunk, int layer,
                             const char *stream, size_t n, float p, mc__gpt_draw *d) {
    int forked, rc;
    mc_rng *r;
    memset(d, 0, sizeof *d);
    if (!g->training || !(p > 0.0f)) return MC_OK;
#if defined(MC_FAULT_HOOKS)
    if (mc__fault_stream[0] != '\0') stream = mc__fault_stream;
#endif
    forked = strcmp(stream, MC_RNG_DEFAULT) != 0;
    if (forked && (rc = mc_rng_tracker_fork(&g->rng, stream)) != MC_OK) return rc;
    r = mc_rng_tracker_current(&g->rng);
    d->seed = r->seed;
    d->offset = r->offset;
    d->p = p;
    r->offset += ((uint64_t)n + 3u) & ~(uint64_t)3u;
    if (forked && (rc = mc_rng_tracker_unfork(&g->rng, stream)) != MC_OK) return rc;
    if (g->dropout_drawn) {
        mc_gpt_dropout_draw t;
        t.site = site;
        t.chunk = chunk;
        t.layer = layer;
        t.replay = g->impl->replaying;
        t.stream = forked ? stream : MC_RNG_DEFAULT;
        t.seed = d->seed;
        t.offset = d->offset;
        t.n = n;
        t.p = p;
        g->dropout_drawn(g->dropout_drawn_user, &t);
    }
    return MC_OK;
}

/* Hidden and embedding dropout: the default generator where the activation is replicated over
   TP, the model-parallel stream where it is split (SP), as Megatron forks the whole block. */
static const char *mc__gpt_hidden_stream(const mc_gpt *g) {
    return g->sequence_parallel ? MC_RNG_MODEL_PARALLEL : MC_RNG_DEFAULT;
}

static float mc__gpt_dropout_p(float p) { return p > 0.0f ? p : 0.0f; }

/* dropout(inp) with the recorded draw: written into buf and returned, or inp itself when the
   dropout is off (no copy). */
static const void *mc__gpt_dropout_forward(mc_gpt *g, void *buf, const void *inp, size_t n,
                                           const mc__gpt_draw *d, int *rc) {
    if (*rc != MC_OK || !(d->p > 0.0f)) return inp;
    *rc = g->ops->dropout_forward(g->ops, buf, inp, n, d->p, d->seed, d->offset, g->dtype);
    return buf;
}

static const void *mc__gpt_dropout_backward(mc_gpt *g, void *buf, const void *dout, size_t n,
                                            const mc__gpt_draw *d, int *rc) {
    if (*rc != MC_OK || !(d->p > 0.0f)) return dout;
    *rc = g->ops->dropout_backward(g->ops, buf, dout, n, d->p, d->seed, d->offset, g->dtype);
    return buf;
}

/* out = a + b (Ns*H activations): the residual connection */
static int mc__gpt_residual(mc_gpt *g, void *out, const void *a, const void *b, size_t n) {
    int rc = g->ops->copy(g->ops, out, a, n, g->dtype, g->dtype);
    return rc == MC_OK ? g->ops->axpy(g->ops, out, 1.0f, b, n, g->dtype) : rc;
}

// ---------------------------------------------------------------------------------------------
// the local spec: LayerNorm, self-attention, MLP

static int mc__gpt_local_norm_forward(const mc_layer_ctx *ctx, int which, void *out,
                                      const void *inp) {
    mc_gpt *g = ctx->gpt;
    struct mc__gpt_layer_cache *c = ctx->cache;
    int w = which ? MC_GPT_LN2_W : MC_GPT_LN1_W;
    return g->ops->layernorm_forward(g->ops, out, which ? c->ln2_mean : c->ln1_mean,
                                     which ? c->ln2_rstd : c->ln1_rstd, inp, ctx->w[w],
                                     ctx->w[w + 1], g->Ns, g->H, MC__GPT_LN_EPS(g), g->dtype);
}

static int mc__gpt_local_norm_backward(const mc_layer_ctx *ctx, int which, void *dinp,
                                       const void *dout, const void *inp) {
    mc_gpt *g = ctx->gpt;
    struct mc__gpt_layer_cache *c = ctx->cache;
    int w = which ? MC_GPT_LN2_W : MC_GPT_LN1_W;
    return g->ops->layernorm_backward(g->ops, dinp, ctx->g[w], ctx->g[w + 1], dout, inp,
                                      ctx->w[w], which ? c->ln2_mean : c->ln1_mean,
                                      which ? c->ln2_rstd : c->ln1_rstd, g->Ns, g->H, g->dtype);
}

/* QKV column-parallel -> causal attention on the local heads (probability dropout under the
   model-parallel stream) -> projection row-parallel (+ bias). out (Ns, H). The three steps
   are tapped as linear_qkv, core_attention and linear_proj. */
static int mc__gpt_local_attention_forward(const mc_layer_ctx *ctx, void *out, const void *inp) {
    mc_gpt *g = ctx->gpt;
    struct mc__gpt_layer_cache *c = ctx->cache;
    size_t n_probs = (size_t)g->B * (size_t)g->NHl * (size_t)g->S * (size_t)g->S;
    float *stats = c->attn_stats ? c->attn_stats : g->impl->stats_scratch;
    int L = ctx->global_layer, rc;
    mc_gpt_tap_tensor qkv = mc__gpt_tt(g, c->qkv, g->dtype, g->N, 3 * g->Ql, 1);
    mc_gpt_tap_tensor atty = mc__gpt_tt(g, c->atty, g->dtype, g->N, g->Ql, 1);
    if ((rc = mc__gpt_column_forward(g, c->qkv, inp, ctx->w[MC_GPT_QKV_W], ctx->w[MC_GPT_QKV_B],
                                     3 * g->Ql, g->H)) != MC_OK)
        return rc;
#if defined(MC_FAULT_HOOKS)
    if ((rc = mc__gpt_fault_qkv_shard(ctx, c->qkv)) != MC_OK) return rc;
#endif
    mc__gpt_tap(g, ctx->chunk, "decoder.layers.%d.self_attention.linear_qkv", L, 0,
                mc__gpt_tt_hidden(g, inp), qkv);
    if ((rc = mc__gpt_draw_from(g, MC_GPT_DROPOUT_ATTENTION_PROBS, ctx->chunk,
                                ctx->global_layer, MC_RNG_MODEL_PARALLEL, n_probs,
                                mc__gpt_dropout_p(g->config.attention_dropout),
                                &c->attn_drop)) != MC_OK)
        return rc;
#if defined(MC_FAULT_HOOKS)
    if ((rc = mc__gpt_fault_softmax(ctx, c->qkv, 1)) != MC_OK) return rc;
#endif
    if ((rc = g->ops->attention_forward(g->ops, c->atty, stats, c->qkv, g->S, g->B, g->NHl,
                                        g->HD, c->attn_drop.p, c->attn_drop.seed,
                                        c->attn_drop.offset, g->dtype)) != MC_OK)
        return rc;
#if defined(MC_FAULT_HOOKS)
    if ((rc = mc__gpt_fault_softmax(ctx, c->qkv, -1)) != MC_OK) return rc;
#endif
    mc__gpt_tap(g, ctx->chunk, "decoder.layers.%d.self_attention.core_attention", L, 0, qkv,
                atty);
    if ((rc = mc__gpt_row_forward(g, out, c->atty, ctx->w[MC_GPT_PROJ_W], ctx->w[MC_GPT_PROJ_B],
                                  g->H, g->Ql, mc__gpt_fault_flags(ctx, MC__GPT_ATTENTION, 0))) !=
        MC_OK)
        return rc;
    mc__gpt_tap(g, ctx->chunk, "decoder.layers.%d.self_attention.linear_proj", L, 0, atty,
                mc__gpt_tt_hidden(g, out));
    return MC_OK;
}

static int mc__gpt_local_attention_backward(const mc_layer_ctx *ctx, void *dinp,
                                            const void *dout, const void *inp) {
    mc_gpt *g = ctx->gpt;
    struct mc__gpt_impl *im = g->impl;
    struct mc__gpt_layer_cache *c = ctx->cache;
    const float *stats = c->attn_stats;
    const void *atty = c->atty;
    int L = ctx->global_layer, rc;
    mc_gpt_tap_tensor d_qkv = mc__gpt_tt(g, im->d_qkv, g->dtype, g->N, 3 * g->Ql, 1);
    mc_gpt_tap_tensor d_atty = mc__gpt_tt(g, im->d_atty, g->dtype, g->N, g->Ql, 1);
    if ((rc = mc__gpt_row_backward(g, im->d_atty, ctx->g[MC_GPT_PROJ_W], ctx->g[MC_GPT_PROJ_B],
                                   dout, c->atty, ctx->w[MC_GPT_PROJ_W], g->H, g->Ql)) != MC_OK)
        return rc;
    mc__gpt_tap(g, ctx->chunk, "decoder.layers.%d.self_attention.linear_proj", L, 1, d_atty,
                mc__gpt_tt_hidden(g, dout));
#if defined(MC_FAULT_HOOKS)
    if ((rc = mc__gpt_fault_softmax(ctx, c->qkv, 1)) != MC_OK) return rc;
#endif
    if (!stats) {
        /* selective recompute: the probabilities again, from the same inputs and draw */
        if ((rc = g->ops->attention_forward(g->ops, im->atty_scratch, im->stats_scratch, c->qkv,
                                            g->S, g->B, g->NHl, g->HD, c->attn_drop.p,
                                            c->attn_drop.seed, c->attn_drop.offset,
                                            g->dtype)) != MC_OK)
            return rc;
        stats = im->stats_scratch;
        atty = im->atty_scratch;
    }
    if ((rc = g->ops->attention_backward(g->ops, im->d_qkv, im->d_atty, c->qkv, atty, stats, g->S,
                                         g->B, g->NHl, g->HD, c->attn_drop.p, c->attn_drop.seed,
                                         c->attn_drop.offset, g->dtype)) != MC_OK)
        return rc;
#if defined(MC_FAULT_HOOKS)
    if ((rc = mc__gpt_fault_softmax(ctx, c->qkv, -1)) != MC_OK) return rc;
    if ((rc = mc__gpt_fault_softmax(ctx, im->d_qkv, 1)) != MC_OK) return rc;
#endif
    mc__gpt_tap(g, ctx->chunk, "decoder.layers.%d.self_attention.core_attention", L, 1, d_qkv,
                d_atty);
#if defined(MC_FAULT_HOOKS)
    if ((rc = mc__gpt_fault_qkv_shard(ctx, im->d_qkv)) != MC_OK) return rc;
#endif
    if ((rc = mc__gpt_column_backward(g, dinp, ctx->g[MC_GPT_QKV_W], ctx->g[MC_GPT_QKV_B],
                                      im->d_qkv, inp, ctx->w[MC_GPT_QKV_W], 3 * g->Ql, g->H,
                                      mc__gpt_fault_flags(ctx, MC__GPT_ATTENTION, 1))) != MC_OK)
        return rc;
    mc__gpt_tap(g, ctx->chunk, "decoder.layers.%d.self_attention.linear_qkv", L, 1,
                mc__gpt_tt_hidden(g, dinp), d_qkv);
    return MC_OK;
}

/* fc1 column-parallel -> GELU (one fused op: the GEMM's epilogue on CUDA) -> fc2 row-parallel
   (+ bias). out (Ns, H). Tapped as linear_fc1 (its output before the GELU, kept by the fused op)
   and linear_fc2 (its input after it). */
static int mc__gpt_local_mlp_forward(const mc_layer_ctx *ctx, void *out, const void *inp) {
    mc_gpt *g = ctx->gpt;
    struct mc__gpt_layer_cache *c = ctx->cache;
    int L = ctx->global_layer, rc;
    if ((rc = mc_column_parallel_linear_gelu_forward(
             c->gelu, c->fc1, g->impl->tp_scratch, inp, ctx->w[MC_GPT_FC1_W],
             ctx->w[MC_GPT_FC1_B], g->S, g->B, g->H, g->Fl * g->tp, mc__gpt_tp_flags(g), g->dtype,
             mc__gpt_tp_comm(g), g->ops)) != MC_OK)
        return rc;
    mc__gpt_tap(g, ctx->chunk, "decoder.layers.%d.mlp.linear_fc1", L, 0, mc__gpt_tt_hidden(g, inp),
                mc__gpt_tt(g, c->fc1, g->dtype, g->N, g->Fl, 1));
    if ((rc = mc__gpt_row_forward(g, out, c->gelu, ctx->w[MC_GPT_FC2_W], ctx->w[MC_GPT_FC2_B],
                                  g->H, g->Fl, mc__gpt_fault_flags(ctx, MC__GPT_MLP, 0))) != MC_OK)
        return rc;
    mc__gpt_tap(g, ctx->chunk, "decoder.layers.%d.mlp.linear_fc2", L, 0,
                mc__gpt_tt(g, c->gelu, g->dtype, g->N, g->Fl, 1), mc__gpt_tt_hidden(g, out));
    return MC_OK;
}

static int mc__gpt_local_mlp_backward(const mc_layer_ctx *ctx, void *dinp, const void *dout,
                                      const void *inp) {
    mc_gpt *g = ctx->gpt;
    struct mc__gpt_impl *im = g->impl;
    struct mc__gpt_layer_cache *c = ctx->cache;
    int L = ctx->global_layer, rc;
    if (!g->tap || im->replaying) {
        /* d fc1 = gelu'(fc1) * (d gelu), the GELU's backward in fc2's dgrad GEMM */
        rc = mc_row_parallel_linear_gelu_backward(
            im->d_fc_b, ctx->g[MC_GPT_FC2_W], ctx->g[MC_GPT_FC2_B], im->tp_scratch, dout, c->gelu,
            c->fc1, ctx->w[MC_GPT_FC2_W], g->S, g->B, g->Fl * g->tp, g->H,
            mc__gpt_tp_flags(g) | MC_TP_INPUT_IS_PARALLEL, g->dtype, mc__gpt_tp_comm(g), g->ops);
    } else { /* a tap sees d gelu, fc2's input grad, which the fused op never writes */
        if ((rc = mc__gpt_row_backward(g, im->d_fc_a, ctx->g[MC_GPT_FC2_W], ctx->g[MC_GPT_FC2_B],
                                       dout, c->gelu, ctx->w[MC_GPT_FC2_W], g->H, g->Fl)) != MC_OK)
            return rc;
        mc__gpt_tap(g, ctx->chunk, "decoder.layers.%d.mlp.linear_fc2", L, 1,
                    mc__gpt_tt(g, im->d_fc_a, g->dtype, g->N, g->Fl, 1),
                    mc__gpt_tt_hidden(g, dout));
        rc = g->ops->gelu_backward(g->ops, im->d_fc_b, c->fc1, im->d_fc_a,
                                   (size_t)g->N * (size_t)g->Fl, g->dtype);
    }
    if (rc != MC_OK)
        return rc;
    if ((rc = mc__gpt_column_backward(g, dinp, ctx->g[MC_GPT_FC1_W], ctx->g[MC_GPT_FC1_B],
                                      im->d_fc_b, inp, ctx->w[MC_GPT_FC1_W], g->Fl, g->H,
                                      mc__gpt_fault_flags(ctx, MC__GPT_MLP, 1))) != MC_OK)
        return rc;
    mc__gpt_tap(g, ctx->chunk, "decoder.layers.%d.mlp.linear_fc1", L, 1, mc__gpt_tt_hidden(g, dinp),
                mc__gpt_tt(g, im->d_fc_b, g->dtype, g->N, g->Fl, 1));
    return MC_OK;
}

MC_API const mc_transformer_spec *mc_transformer_spec_local(void) {
    static const mc_transformer_spec spec = {
        "local",
        mc__gpt_local_norm_forward,      mc__gpt_local_norm_backward,
        mc__gpt_local_attention_forward, mc__gpt_local_attention_backward,
        mc__gpt_local_mlp_forward,       mc__gpt_local_mlp_backward,
        NULL, NULL, NULL, NULL,          /* accepts every shape, no own cache, Megatron's names */
    };
    return &spec;
}

// ---------------------------------------------------------------------------------------------
// the transformer layer and the block

static void *mc__gpt_p(const mc_gpt *g, int idx) {
    return mc__gpt_at(g, g->params, g->table.info[idx].offset);
}
static float *mc__gpt_g(const mc_gpt *g, int idx) { return g->grads + g->table.info[idx].offset; }

static void mc__gpt_layer_ctx(mc_gpt *g, int chunk, int l, struct mc__gpt_layer_cache *cache,
                              mc_layer_ctx *ctx) {
    size_t at = ((size_t)chunk * (size_t)g->layers_per_chunk + (size_t)l) * MC_GPT_LAYER_TENSORS;
    const int *idx = g->impl->layer_params + at;
    int t;
    ctx->gpt = g;
    ctx->chunk = chunk;
    ctx->layer = l;
    ctx->global_layer = g->layer_offset[chunk] + l;
    ctx->cache = cache;
    ctx->attention_cache = cache->attention;
    ctx->attention_scratch = g->impl->attention_scratch;
    for (t = 0; t < MC_GPT_LAYER_TENSORS; t++) {
        ctx->w[t] = mc__gpt_p(g, idx[t]);
        ctx->g[t] = mc__gpt_g(g, idx[t]);
    }
}

/* The pre-LN layer (Megatron's TransformerLayer with the spec's submodules):
     res1 = x + dropout(attention(input_layernorm(x)))
     out  = res1 + dropout(mlp(pre_mlp_layernorm(res1)))         all (Ns, H) */
static int mc__gpt_layer_forward(const mc_layer_ctx *ctx, void *out, const void *x) {
    mc_gpt *g = ctx->gpt;
    const mc_transformer_spec *sp = &g->impl->spec;
    struct mc__gpt_layer_cache *c = ctx->cache;
    struct mc__gpt_impl *im = g->impl;
    size_t n = (size_t)g->Ns * (size_t)g->H;
    float p = mc__gpt_dropout_p(g->config.hidden_dropout);
    const void *sub;
    int L = ctx->global_layer, ch = ctx->chunk, rc;
    if ((rc = sp->norm_forward(ctx, 0, c->ln1, x)) != MC_OK) return rc;
    mc__gpt_tap(g, ch, "decoder.layers.%d.input_layernorm", L, 0, mc__gpt_tt_hidden(g, x),
                mc__gpt_tt_hidden(g, c->ln1));
    if ((rc = sp->attention_forward(ctx, im->tmp_a, c->ln1)) != MC_OK) return rc;
    mc__gpt_tap(g, ch, "decoder.layers.%d.self_attention", L, 0, mc__gpt_tt_hidden(g, c->ln1),
                mc__gpt_tt_hidden(g, im->tmp_a));
    if ((rc = mc__gpt_draw_from(g, MC_GPT_DROPOUT_ATTENTION_OUT, ctx->chunk,
                                ctx->global_layer, mc__gpt_hidden_stream(g), n, p,
                                &c->drop1)) != MC_OK)
        return rc;
    sub = mc__gpt_dropout_forward(g, im->tmp_b, im->tmp_a, n, &c->drop1, &rc);
    if (rc == MC_OK) rc = mc__gpt_residual(g, c->res1, x, sub, n);
    if (rc != MC_OK) return rc;
    if ((rc = sp->norm_forward(ctx, 1, c->ln2, c->res1)) != MC_OK) return rc;
    mc__gpt_tap(g, ch, "decoder.layers.%d.pre_mlp_layernorm", L, 0,
                mc__gpt_tt_hidden(g, c->res1), mc__gpt_tt_hidden(g, c->ln2));
    if ((rc = sp->mlp_forward(ctx, im->tmp_a, c->ln2)) != MC_OK) return rc;
    mc__gpt_tap(g, ch, "decoder.layers.%d.mlp", L, 0, mc__gpt_tt_hidden(g, c->ln2),
                mc__gpt_tt_hidden(g, im->tmp_a));
    if ((rc = mc__gpt_draw_from(g, MC_GPT_DROPOUT_MLP_OUT, ctx->chunk, ctx->global_layer,
                                mc__gpt_hidden_stream(g), n, p, &c->drop2)) != MC_OK)
        return rc;
    sub = mc__gpt_dropout_forward(g, im->tmp_b, im->tmp_a, n, &c->drop2, &rc);
    return rc == MC_OK ? mc__gpt_residual(g, out, c->res1, sub, n) : rc;
}

/* dx (Ns, H) = d layer / d x (overwrite); parameter grads accumulate. Uses d_b, d_c, d_ln, so
   dx and dout must be other buffers (the block ping-pongs d_a / dinput). */
static int mc__gpt_layer_backward(const mc_layer_ctx *ctx, void *dx, const void *dout,
                                  const void *x) {
    mc_gpt *g = ctx->gpt;
    const mc_transformer_spec *sp = &g->impl->spec;
    struct mc__gpt_layer_cache *c = ctx->cache;
    struct mc__gpt_impl *im = g->impl;
    size_t n = (size_t)g->Ns * (size_t)g->H;
    void *d_res1 = im->d_b;
    const void *d_sub;
    int L = ctx->global_layer, ch = ctx->chunk, rc = MC_OK;
    /* out = res1 + dropout(mlp): the residual passes dout through */
    d_sub = mc__gpt_dropout_backward(g, im->d_c, dout, n, &c->drop2, &rc);
    if (rc != MC_OK || (rc = sp->mlp_backward(ctx, im->d_ln, d_sub, c->ln2)) != MC_OK) return rc;
    mc__gpt_tap(g, ch, "decoder.layers.%d.mlp", L, 1, mc__gpt_tt_hidden(g, im->d_ln),
                mc__gpt_tt_hidden(g, d_sub));
    if ((rc = g->ops->copy(g->ops, d_res1, dout, n, g->dtype, g->dtype)) != MC_OK) return rc;
    if ((rc = sp->norm_backward(ctx, 1, d_res1, im->d_ln, c->res1)) != MC_OK) return rc;
    mc__gpt_tap(g, ch, "decoder.layers.%d.pre_mlp_layernorm", L, 1, mc__gpt_tt_none,
                mc__gpt_tt_hidden(g, im->d_ln));
    /* res1 = x + dropout(attention) */
    d_sub = mc__gpt_dropout_backward(g, im->d_c, d_res1, n, &c->drop1, &rc);
    if (rc != MC_OK || (rc = sp->attention_backward(ctx, im->d_ln, d_sub, c->ln1)) != MC_OK)
        return rc;
    mc__gpt_tap(g, ch, "decoder.layers.%d.self_attention", L, 1, mc__gpt_tt_hidden(g, im->d_ln),
                mc__gpt_tt_hidden(g, d_sub));
    if ((rc = g->ops->copy(g->ops, dx, d_res1, n, g->dtype, g->dtype)) != MC_OK) return rc;
    if ((rc = sp->norm_backward(ctx, 0, dx, im->d_ln, x)) != MC_OK) return rc;
    mc__gpt_tap(g, ch, "decoder.layers.%d.input_layernorm", L, 1, mc__gpt_tt_none,
                mc__gpt_tt_hidden(g, im->d_ln));
    return MC_OK;
}

static struct mc__gpt_layer_cache *mc__gpt_cache_of(mc_gpt *g, mc__gpt_act *a, int l) {
    int grp = g->impl->group_of[l];
    return grp < 0 ? &a->layer[l] : &g->impl->rc_cache[l - g->impl->group_start[grp]];
}

static int mc__gpt_run_layers(mc_gpt *g, int chunk, mc__gpt_act *a, int first, int count) {
    mc_layer_ctx ctx;
    int l, rc;
    for (l = first; l < first + count; l++) {
        mc__gpt_layer_ctx(g, chunk, l, mc__gpt_cache_of(g, a, l), &ctx);
        if ((rc = mc__gpt_layer_forward(&ctx, a->res[l + 1], a->res[l])) != MC_OK) return rc;
        mc__gpt_tap(g, chunk, "decoder.layers.%d", ctx.global_layer, 0,
                    mc__gpt_tt_hidden(g, a->res[l]), mc__gpt_tt_hidden(g, a->res[l + 1]));
    }
    return MC_OK;
}

/* The block forward: res[0] -> res[nl]. A recompute group first records every stream, then
   runs its layers into the shared scratch (only its output res[end] survives). */
static int mc__gpt_block_forward(mc_gpt *g, int chunk, mc__gpt_act *a) {
    struct mc__gpt_impl *im = g->impl;
    int l = 0, rc;
    while (l < g->layers_per_chunk) {
        int grp = im->group_of[l];
        int count = grp < 0 ? 1 : im->group_len[grp];
        if (grp >= 0 && (rc = mc_rng_tracker_get_states(&g->rng, &a->group_rng[grp])) != MC_OK)
            return rc;
        if ((rc = mc__gpt_run_layers(g, chunk, a, l, count)) != MC_OK) return rc;
        l += count;
    }
    return MC_OK;
}

static void mc__gpt_report_ready(mc_gpt *g, int chunk, int param) {
    if (param >= 0 && g->grad_ready && g->grad_sync[chunk])
        g->grad_ready(g->grad_ready_user, param);
}

/* The block backward: d (Ns, H) holds d res[nl] on entry and d res[0] on return (in
   a->dinput). Before the last layer of a recompute group runs its backward, the group's
   forward is replayed under its stream snapshot (§6.4). */
static int mc__gpt_block_backward(mc_gpt *g, int chunk, mc__gpt_act *a, const void *d_out) {
    struct mc__gpt_impl *im = g->impl;
    size_t n = (size_t)g->Ns * (size_t)g->H;
    const void *dout = d_out;
    void *bufs[2];
    int l, t, rc, k = 0;
    mc_layer_ctx ctx;
    /* ping-pong between d_a and dinput so that the last write lands in dinput */
    bufs[0] = (g->layers_per_chunk % 2) ? a->dinput : im->d_a;
    bufs[1] = (g->layers_per_chunk % 2) ? im->d_a : a->dinput;
    if (g->layers_per_chunk == 0 &&
        (rc = g->ops->copy(g->ops, a->dinput, d_out, n, g->dtype, g->dtype)) != MC_OK)
        return rc;
    for (l = g->layers_per_chunk - 1; l >= 0; l--) {
        int grp = im->group_of[l];
        const int *idx;
        if (grp >= 0 && l == im->group_start[grp] + im->group_len[grp] - 1) {
            mc_rng_states now;
            if ((rc = mc_rng_tracker_get_states(&g->rng, &now)) != MC_OK) return rc;
            if (!MC__FAULT_RECOMPUTE(MC_FAULT_RECOMPUTE_NO_SNAPSHOT) &&
                (rc = mc_rng_tracker_set_states(&g->rng, &a->group_rng[grp])) != MC_OK)
                return rc;
            im->replaying = 1;   /* a replay, not a new call of the modules: no tensor taps */
            rc = mc__gpt_run_layers(g, chunk, a, im->group_start[grp], im->group_len[grp]);
            im->replaying = 0;
            if (rc != MC_OK) return rc;
            if (!MC__FAULT_RECOMPUTE(MC_FAULT_RECOMPUTE_NO_OUTER) &&
                (rc = mc_rng_tracker_set_states(&g->rng, &now)) != MC_OK)
                return rc;
        }
        mc__gpt_layer_ctx(g, chunk, l, mc__gpt_cache_of(g, a, l), &ctx);
        if ((rc = mc__gpt_layer_backward(&ctx, bufs[k], dout, a->res[l])) != MC_OK) return rc;
        mc__gpt_tap(g, chunk, "decoder.layers.%d", ctx.global_layer, 1,
                    mc__gpt_tt_hidden(g, bufs[k]), mc__gpt_tt_hidden(g, dout));
        dout = bufs[k];
        k ^= 1;
        idx = im->layer_params +
              ((size_t)chunk * (size_t)g->layers_per_chunk + (size_t)l) * MC_GPT_LAYER_TENSORS;
        for (t = 0; t < MC_GPT_LAYER_TENSORS; t++) mc__gpt_report_ready(g, chunk, idx[t]);
    }
    return MC_OK;
}

// ---------------------------------------------------------------------------------------------
// GPTModel: embedding, final norm, output layer, loss

/* word (vocab-parallel, all-reduced over TP) + learned position embedding -> (SP: scatter to
   this rank's sequence piece) -> embedding dropout -> res[0] (Ns, H). Megatron reduce-scatters
   the word lookup straight to SP only without learned positions; here they are added first. */
static int mc__gpt_embedding_forward(mc_gpt *g, mc__gpt_act *a) {
    struct mc__gpt_impl *im = g->impl;
    const mc_ops *o = g->ops;
    size_t n = (size_t)g->Ns * (size_t)g->H;
    void *emb = im->full_b;    /* (N, H) */
    const void *dropped;
    int rc;
    if ((rc = mc_vocab_parallel_embedding_forward(emb, a->tokens, mc__gpt_p(g, im->word[0]), g->N,
                                                  g->H, g->vocab_padded, g->dtype,
                                                  mc__gpt_tp_comm(g), o)) != MC_OK)
        return rc;
    if ((rc = o->embedding_forward(o, im->full_a, im->pos_ids, mc__gpt_p(g, im->pos[0]), g->N,
                                   g->H, 0, g->config.max_position_embeddings, g->dtype)) !=
        MC_OK)
        return rc;
    if ((rc = o->axpy(o, emb, 1.0f, im->full_a, (size_t)g->N * (size_t)g->H, g->dtype)) != MC_OK)
        return rc;
    if (g->sequence_parallel) {
        if ((rc = mc_scatter_to_sp_region_forward(im->tmp_a, emb, g->S, (size_t)g->B * g->H,
                                                  g->dtype, mc__gpt_tp_comm(g), o)) != MC_OK)
            return rc;
        emb = im->tmp_a;
    }
    if ((rc = mc__gpt_draw_from(g, MC_GPT_DROPOUT_EMBEDDING, 0, -1, mc__gpt_hidden_stream(g), n,
                                mc__gpt_dropout_p(g->config.hidden_dropout), &a->emb_drop)) !=
        MC_OK)
        return rc;
    dropped = mc__gpt_dropout_forward(g, a->res[0], emb, n, &a->emb_drop, &rc);
    if (rc == MC_OK && dropped != a->res[0])
        rc = o->copy(o, a->res[0], dropped, n, g->dtype, g->dtype);
    if (rc == MC_OK)
        mc__gpt_tap(g, 0, "embedding", -1, 0, mc__gpt_tt_none, mc__gpt_tt_hidden(g, a->res[0]));
    return rc;
}

/* d res[0] (a->dinput) -> word and position embedding grads. Under SP the scatter's backward
   all-gathers the sequence pieces; the word embedding's all-reduce has an identity backward,
   so each rank adds the rows of its vocab range only. */
static int mc__gpt_embedding_backward(mc_gpt *g, mc__gpt_act *a) {
    struct mc__gpt_impl *im = g->impl;
    const mc_ops *o = g->ops;
    size_t n = (size_t)g->Ns * (size_t)g->H;
    const void *d_emb;
    int rc = MC_OK;
    d_emb = mc__gpt_dropout_backward(g, im->d_c, a->dinput, n, &a->emb_drop, &rc);
    if (rc != MC_OK) return rc;
    if (g->sequence_parallel) {
        if ((rc = mc_scatter_to_sp_region_backward(im->full_b, d_emb, g->S, (size_t)g->B * g->H,
                                                   g->dtype, mc__gpt_tp_comm(g), o)) != MC_OK)
            return rc;
        d_emb = im->full_b;
    }
    if ((rc = mc_vocab_parallel_embedding_backward(mc__gpt_g(g, im->word[0]), d_emb, a->tokens,
                                                   g->N, g->H, g->vocab_padded, g->dtype,
                                                   mc__gpt_tp_comm(g), o)) != MC_OK)
        return rc;
    if ((rc = o->embedding_backward(o, mc__gpt_g(g, im->pos[0]), d_emb, im->pos_ids, g->N, g->H,
                                    0, g->config.max_position_embeddings, g->dtype)) != MC_OK)
        return rc;
    mc__gpt_tap(g, 0, "embedding", -1, 1, mc__gpt_tt_none, mc__gpt_tt_hidden(g, a->dinput));
    mc__gpt_report_ready(g, 0, im->word[0]);
    mc__gpt_report_ready(g, 0, im->pos[0]);
    return MC_OK;
}

/* The weight the output layer multiplies with: its own, or the word embedding (tied, PP = 1) */
static int mc__gpt_output_weight(const mc_gpt *g, int chunk) {
    return g->impl->out_w[chunk] >= 0 ? g->impl->out_w[chunk] : g->impl->word[chunk];
}

/* final_layernorm -> output layer (column-parallel, no bias, logits (N, Vl)) -> loss */
static int mc__gpt_head_forward(mc_gpt *g, int chunk, mc__gpt_act *a, const void *h,
                                double *loss_sum) {
    struct mc__gpt_impl *im = g->impl;
    const mc_ops *o = g->ops;
    int rc;
    if ((rc = o->layernorm_forward(o, a->lnf, a->lnf_mean, a->lnf_rstd, h,
                                   mc__gpt_p(g, im->lnf_w[chunk]), mc__gpt_p(g, im->lnf_b[chunk]),
                                   g->Ns, g->H, MC__GPT_LN_EPS(g), g->dtype)) != MC_OK)
        return rc;
    mc__gpt_tap(g, chunk, "decoder.final_layernorm", -1, 0, mc__gpt_tt_hidden(g, h),
                mc__gpt_tt_hidden(g, a->lnf));
    if ((rc = mc__gpt_column_forward(g, a->logits, a->lnf,
                                     mc__gpt_p(g, mc__gpt_output_weight(g, chunk)), NULL,
                                     g->vocab_local, g->H)) != MC_OK)
        return rc;
    mc__gpt_tap(g, chunk, "output_layer", -1, 0, mc__gpt_tt_hidden(g, a->lnf),
                mc__gpt_tt(g, a->logits, g->dtype, g->N, g->vocab_local, 1));
    if (!a->has_labels) return MC_OK;
    /* vocab-parallel cross entropy: three TP all-reduces, never the full logits; the loss sum
       stays in op memory and is read back only when the caller asks for it */
    if ((rc = mc_vocab_parallel_cross_entropy_forward(a->losses, a->loss_sum, a->ce_max,
                                                      a->ce_sum, (float *)im->tp_scratch,
                                                      a->logits, a->labels, g->N,
                                                      g->vocab_padded, 0.0f, g->dtype,
                                                      mc__gpt_tp_comm(g), o)) != MC_OK)
        return rc;
    mc__gpt_tap(g, chunk, "loss", -1, 0,
                mc__gpt_tt(g, a->logits, g->dtype, g->N, g->vocab_local, 1),
                mc__gpt_tt(g, a->losses, MC_F32, g->N, 1, 0));
    if (loss_sum) return o->download(o, loss_sum, a->loss_sum, sizeof(double));
    return MC_OK;
}

/* loss -> logits -> output layer -> final norm: d res[nl] into d (Ns, H) */
static int mc__gpt_head_backward(mc_gpt *g, int chunk, mc__gpt_act *a, float loss_scale,
                                 void *d) {
    struct mc__gpt_impl *im = g->impl;
    const mc_ops *o = g->ops;
    int w = mc__gpt_output_weight(g, chunk), rc;
    if ((rc = o->fill(o, im->d_loss, loss_scale, (size_t)g->N, MC_F32)) != MC_OK) return rc;
    if ((rc = mc_vocab_parallel_cross_entropy_backward(im->d_logits, im->d_loss, a->logits,
                                                       a->ce_max, a->ce_sum, a->labels, g->N,
                                                       g->vocab_padded, 0.0f, g->dtype,
                                                       mc__gpt_tp_comm(g), o)) != MC_OK)
        return rc;
    mc__gpt_tap(g, chunk, "loss", -1, 1,
                mc__gpt_tt(g, im->d_logits, g->dtype, g->N, g->vocab_local, 1),
                mc__gpt_tt(g, im->d_loss, MC_F32, g->N, 1, 0));
    if ((rc = mc__gpt_column_backward(g, im->d_ln, mc__gpt_g(g, w), NULL, im->d_logits, a->lnf,
                                      mc__gpt_p(g, w), g->vocab_local, g->H, 0)) != MC_OK)
        return rc;
    mc__gpt_tap(g, chunk, "output_layer", -1, 1, mc__gpt_tt_hidden(g, im->d_ln),
                mc__gpt_tt(g, im->d_logits, g->dtype, g->N, g->vocab_local, 1));
    if ((rc = o->fill(o, d, 0.0f, (size_t)g->Ns * (size_t)g->H, g->dtype)) != MC_OK) return rc;
    if ((rc = o->layernorm_backward(o, d, mc__gpt_g(g, im->lnf_w[chunk]),
                                    mc__gpt_g(g, im->lnf_b[chunk]), im->d_ln,
                                    a->res[g->layers_per_chunk], mc__gpt_p(g, im->lnf_w[chunk]),
                                    a->lnf_mean, a->lnf_rstd, g->Ns, g->H, g->dtype)) != MC_OK)
        return rc;
    mc__gpt_tap(g, chunk, "decoder.final_layernorm", -1, 1, mc__gpt_tt_hidden(g, d),
                mc__gpt_tt_hidden(g, im->d_ln));
    mc__gpt_report_ready(g, chunk, im->out_w[chunk]);
    mc__gpt_report_ready(g, chunk, im->lnf_w[chunk]);
    mc__gpt_report_ready(g, chunk, im->lnf_b[chunk]);
    return MC_OK;
}

static int mc__gpt_check_call(const mc_gpt *g, const char *fn, int chunk, int slot) {
    if (!g || !g->impl) return MC__FAIL(MC_ERR_STATE, "%s: the model is not initialised", fn);
    if (chunk < 0 || chunk >= g->n_chunks)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: chunk (%d) must be in [0, %d)", fn, chunk,
                        g->n_chunks);
    if (slot < 0 || slot >= g->n_slots)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: slot (%d) must be in [0, n_slots = %d)", fn,
                        slot, g->n_slots);
    return MC_OK;
}

MC_API int mc_gpt_is_pre_process(const mc_gpt *g, int chunk) {
    return g && g->pp_rank == 0 && chunk == 0;
}

MC_API int mc_gpt_is_post_process(const mc_gpt *g, int chunk) {
    return g && g->pp_rank == g->pp - 1 && chunk == g->n_chunks - 1;
}

/* The caller's host ids, checked against the vocabulary and uploaded into op memory. */
static int mc__gpt_upload_ids(mc_gpt *g, int *dst, const int *ids, const char *what) {
    int n;
    for (n = 0; n < g->N; n++)
        if (ids[n] < 0 || ids[n] >= g->config.vocab_size)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "mc_gpt_forward: %s[%d] = %d is outside the vocabulary [0, %d)", what,
                            n, ids[n], g->config.vocab_size);
    return g->ops->upload(g->ops, dst, ids, (size_t)g->N * sizeof(int));
}

MC_API int mc_gpt_forward(mc_gpt *g, int chunk, int slot, const int *tokens, const int *labels,
                          const float *input, float **output, double *loss_sum) {
    mc__gpt_act *a;
    int rc;
    if ((rc = mc__gpt_check_call(g, "mc_gpt_forward", chunk, slot)) != MC_OK) return rc;
    a = &g->impl->act[chunk * g->n_slots + slot];
    if (output) *output = NULL;
    if (loss_sum) *loss_sum = 0.0;
    a->forward_done = 0;
    g->impl->tap_slot = slot;
    g->impl->tap_microbatch = a->microbatch;
    if (mc_gpt_is_pre_process(g, chunk)) {
        if (!tokens)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "mc_gpt_forward: tokens must be given on the first stage (chunk %d)",
                            chunk);
        if ((rc = mc__gpt_upload_ids(g, a->tokens, tokens, "tokens")) != MC_OK) return rc;
        if ((rc = mc__gpt_embedding_forward(g, a)) != MC_OK) return rc;
    } else {
        if (!input)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "mc_gpt_forward: input must be given on virtual stage %d (chunk %d "
                            "of pipeline rank %d)", chunk * g->pp + g->pp_rank, chunk,
                            g->pp_rank);
        if ((rc = g->ops->copy(g->ops, a->res[0], input, g->p2p_elems, g->dtype, g->dtype)) !=
            MC_OK)
            return rc;
    }
    if ((rc = mc__gpt_block_forward(g, chunk, a)) != MC_OK) return rc;
    if (mc_gpt_is_post_process(g, chunk)) {
        a->has_labels = labels != NULL;
        if (labels && (rc = mc__gpt_upload_ids(g, a->labels, labels, "labels")) != MC_OK)
            return rc;
        if ((rc = mc__gpt_head_forward(g, chunk, a, a->res[g->layers_per_chunk], loss_sum))
            != MC_OK)
            return rc;
    } else if (output) {
        *output = (float *)a->res[g->layers_per_chunk];
    }
    a->forward_done = 1;
    return MC_OK;
}

MC_API int mc_gpt_backward(mc_gpt *g, int chunk, int slot, const float *output_grad,
                           float loss_scale, float **input_grad) {
    struct mc__gpt_impl *im;
    mc__gpt_act *a;
    const void *d_out;
    int rc;
    if ((rc = mc__gpt_check_call(g, "mc_gpt_backward", chunk, slot)) != MC_OK) return rc;
    im = g->impl;
    a = &im->act[chunk * g->n_slots + slot];
    if (input_grad) *input_grad = NULL;
    im->tap_slot = slot;
    im->tap_microbatch = a->microbatch;
    if (!a->forward_done)
        return MC__FAIL(MC_ERR_STATE,
                        "mc_gpt_backward: slot %d of chunk %d holds no forward to go back "
                        "through", slot, chunk);
    if (mc_gpt_is_post_process(g, chunk)) {
        if (output_grad)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "mc_gpt_backward: the last stage starts from the loss, so "
                            "output_grad must be NULL");
        if (!a->has_labels)
            return MC__FAIL(MC_ERR_STATE,
                            "mc_gpt_backward: the forward of slot %d had no labels, so there is "
                            "no loss to go back from", slot);
        /* the block's layer backwards alternate between d_a and dinput and end in dinput:
           start from the one its first write does not go to */
        d_out = (g->layers_per_chunk % 2) ? im->d_a : a->dinput;
        if ((rc = mc__gpt_head_backward(g, chunk, a, loss_scale, (void *)(uintptr_t)d_out)) !=
            MC_OK)
            return rc;
    } else {
        if (!output_grad)
            return MC__FAIL(MC_ERR_INVALID_ARG,
                            "mc_gpt_backward: output_grad must be given below the last stage "
                            "(chunk %d of pipeline rank %d)", chunk, g->pp_rank);
        d_out = output_grad;
    }
    if ((rc = mc__gpt_block_backward(g, chunk, a, d_out)) != MC_OK) return rc;
    a->forward_done = 0;
    if (mc_gpt_is_pre_process(g, chunk)) return mc__gpt_embedding_backward(g, a);
    if (input_grad) *input_grad = (float *)a->dinput;
    return MC_OK;
}

MC_API int mc_gpt_forward_step(mc_gpt *g, int chunk, int microbatch, const int *tokens,
                               const int *labels, const float *input, float **output,
                               double *loss_sum, double *num_tokens) {
    int slot, rc;
    if ((rc = mc__gpt_check_call(g, "mc_gpt_forward_step", chunk, 0)) != MC_OK) return rc;
    if (microbatch < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_gpt_forward_step: microbatch (%d) must be >= 0",
                        microbatch);
    slot = microbatch % g->n_slots;
    g->impl->act[chunk * g->n_slots + slot].microbatch = microbatch;
    if (num_tokens) *num_tokens = 0.0;
    rc = mc_gpt_forward(g, chunk, slot, tokens, labels, input, output, loss_sum);
    if (rc == MC_OK && num_tokens && mc_gpt_is_post_process(g, chunk) && labels)
        *num_tokens = (double)g->N;
    return rc;
}

MC_API int mc_gpt_backward_step(mc_gpt *g, int chunk, int microbatch, const float *output_grad,
                                float loss_scale, float **input_grad) {
    int slot, rc, held;
    if ((rc = mc__gpt_check_call(g, "mc_gpt_backward_step", chunk, 0)) != MC_OK) return rc;
    if (microbatch < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_gpt_backward_step: microbatch (%d) must be >= 0",
                        microbatch);
    slot = microbatch % g->n_slots;
    held = g->impl->act[chunk * g->n_slots + slot].microbatch;
    if (held != microbatch)
        return MC__FAIL(MC_ERR_STATE,
                        "mc_gpt_backward_step: slot %d of chunk %d holds micro-batch %d, not %d: "
                        "more micro-batches are in flight than n_slots (%d)",
                        slot, chunk, held, microbatch, g->n_slots);
    return mc_gpt_backward(g, chunk, slot, output_grad, loss_scale, input_grad);
}

MC_API int mc_gpt_zero_grad(mc_gpt *g) {
    if (!g || !g->grads) return MC_OK;
    return g->ops->fill(g->ops, g->grads, 0.0f, g->table.total, MC_F32);
}

MC_API void mc_gpt_set_grad_sync(mc_gpt *g, int chunk, int enable) {
    if (g && chunk >= 0 && chunk < MC_GPT_MAX_CHUNKS) g->grad_sync[chunk] = enable ? 1 : 0;
}

MC_API void *mc_gpt_param(const mc_gpt *g, const char *name) {
    int i = g && name ? mc_param_table_find(&g->table, name) : -1;
    return i < 0 ? NULL : mc__gpt_p(g, i);
}

MC_API float *mc_gpt_grad(const mc_gpt *g, const char *name) {
    int i = g && name ? mc_param_table_find(&g->table, name) : -1;
    return i < 0 ? NULL : mc__gpt_g(g, i);
}

MC_API const float *mc_gpt_losses(const mc_gpt *g, int slot) {
    int last;
    if (!g || !g->impl || slot < 0 || slot >= g->n_slots) return NULL;
    last = g->n_chunks - 1;
    if (!mc_gpt_is_post_process(g, last)) return NULL;
    return g->impl->act[last * g->n_slots + slot].losses;
}

MC_API int mc_gpt_logits(mc_gpt *g, int slot, float *out, int *n_vocab) {
    const mc_ops *o;
    int last, rc = MC_OK, rows_v;
    const void *local;
    void *tmp = NULL;
    size_t n;
    if ((rc = mc__gpt_check_call(g, "mc_gpt_logits", 0, slot)) != MC_OK) return rc;
    o = g->ops;
    last = g->n_chunks - 1;
    if (!mc_gpt_is_post_process(g, last))
        return MC__FAIL(MC_ERR_STATE, "mc_gpt_logits: pipeline rank %d is not the last stage",
                        g->pp_rank);
    local = g->impl->act[last * g->n_slots + slot].logits;
    rows_v = g->gather_logits ? g->vocab_padded : g->vocab_local;
    n = (size_t)g->N * (size_t)rows_v;
    if (n_vocab) *n_vocab = rows_v;
    if (!out) return MC_OK;
    if (!g->gather_logits) return o->copy(o, out, local, n, MC_F32, g->dtype);
    /* gather_from_tensor_model_parallel_region: [N, Vl] of every rank -> [N, Vp] (in the
       model's dtype, then converted to fp32) */
    if (g->dtype == MC_F32)
        return mc_gather_from_tp_region_forward(out, NULL, local, g->N, g->vocab_padded, MC_F32,
                                                mc__gpt_tp_comm(g), o);
    if ((rc = mc_ops_alloc(o, MC_MEMORY_ACTIVATIONS, &tmp, mc_dtype_bytes(g->dtype, n))) != MC_OK)
        return rc;
    rc = mc_gather_from_tp_region_forward(tmp, NULL, local, g->N, g->vocab_padded, g->dtype,
                                          mc__gpt_tp_comm(g), o);
    if (rc == MC_OK) rc = o->copy(o, out, tmp, n, MC_F32, g->dtype);
    mc_ops_free(o, tmp);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// construction

MC_API int mc_gpt_num_layers_to_build(const mc_gpt_config *cfg) {
    int pp, v;
    if (!cfg) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_gpt_num_layers_to_build: cfg is NULL");
    pp = MC__DEF(cfg->pipeline_model_parallel_size, 1);
    v = cfg->virtual_pipeline_model_parallel_size > 1 ? cfg->virtual_pipeline_model_parallel_size
                                                      : 1;
    if (cfg->num_layers <= 0 || pp <= 0 || cfg->num_layers % (pp * v) != 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "num_layers (%d) is not divisible by pipeline_model_parallel_size (%d) x "
                        "virtual_pipeline_model_parallel_size (%d)",
                        cfg->num_layers, pp, v);
    return cfg->num_layers / (pp * v);
}

MC_API int mc_gpt_layer_offset(const mc_gpt_config *cfg, int pp_rank, int vp_stage) {
    int per_chunk = mc_gpt_num_layers_to_build(cfg), v;
    if (per_chunk < 0) return per_chunk;
    v = cfg->virtual_pipeline_model_parallel_size > 1 ? cfg->virtual_pipeline_model_parallel_size
                                                      : 1;
    /* vp_stage * (L / VPP) + pp_rank * (L / (PP * VPP)) */
    return vp_stage * (cfg->num_layers / v) + pp_rank * per_chunk;
}

/* Registers one parameter. cols == 0: a 1-D tensor of `rows` elements. pdim: -1 replicated,
   0 or 1 the dimension split over TP. */
static int mc__gpt_add_param(mc_gpt *g, const char *name, int rows, int cols, int pdim,
                             int sequence_parallel, int no_wd, int shared, int shared_emb,
                             int chunk, int layer) {
    mc_param_info p;
    memset(&p, 0, sizeof p);
    p.ndim = cols > 0 ? 2 : 1;
    p.global_shape[0] = p.local_shape[0] = rows;
    p.global_shape[1] = p.local_shape[1] = cols > 0 ? cols : 1;
    if (pdim >= 0) p.local_shape[pdim] /= g->tp;
    p.partition_dim = pdim;
    p.partition_stride = 1;
    p.tensor_model_parallel = pdim >= 0;
    p.sequence_parallel = sequence_parallel;
    p.shared = shared;
    p.shared_embedding = shared_emb;
    p.no_weight_decay = no_wd;
    p.chunk = chunk;
    p.layer = layer;
    p.numel = (size_t)p.local_shape[0] * (size_t)p.local_shape[1];
    return mc_param_table_add(&g->table, name, &p);
}

static const char *const mc__gpt_layer_names[MC_GPT_LAYER_TENSORS] = {
    "input_layernorm.weight",           "input_layernorm.bias",
    "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
    "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
    "pre_mlp_layernorm.weight",         "pre_mlp_layernorm.bias",
    "mlp.linear_fc1.weight",            "mlp.linear_fc1.bias",
    "mlp.linear_fc2.weight",            "mlp.linear_fc2.bias",
};

MC_API const char *mc_gpt_layer_tensor_name(int t) {
    return t >= 0 && t < MC_GPT_LAYER_TENSORS ? mc__gpt_layer_names[t] : NULL;
}

/* The key of layer tensor t below "decoder.layers.{L}.": the spec's, or Megatron's. */
static const char *mc__gpt_tensor_name(const mc_gpt *g, int t) {
    const char *const *names = g->spec->tensor_names;
    return names && names[t] ? names[t] : mc__gpt_layer_names[t];
}

/* The spec's names must make keys: non-empty, printable without spaces (metadata.txt and
   file names carry them), short enough for MC_PARAM_NAME_MAX with the layer prefix. */
static int mc__gpt_check_tensor_names(const mc_gpt *g) {
    int t;
    for (t = 0; t < MC_GPT_LAYER_TENSORS; t++) {
        const char *n = mc__gpt_tensor_name(g, t), *c;
        int ok = n[0] != '\0' && strlen(n) + 24 < MC_PARAM_NAME_MAX;
        for (c = n; ok && *c; c++) ok = *c > ' ' && *c < 127 && *c != '/';
        if (!ok)
            return MC__FAIL(MC_ERR_INVALID_DESC,
                            "mc_gpt_init: spec '%s' tensor_names[%d] (\"%s\") must be a "
                            "non-empty key of printable characters without spaces or '/', "
                            "shorter than %d with its \"decoder.layers.N.\" prefix",
                            g->spec->name ? g->spec->name : "?", t, n, MC_PARAM_NAME_MAX - 24);
    }
    return MC_OK;
}

/* Megatron's module order: embedding, decoder layers, final norm, output layer; chunk by
   chunk. Records each parameter's index. */
static int mc__gpt_register(mc_gpt *g) {
    struct mc__gpt_impl *im = g->impl;
    int sp = g->sequence_parallel, c, l, t, idx;
    char name[MC_PARAM_NAME_MAX];
    /* (rows, cols, partition dim, sequence_parallel, no_weight_decay) of each layer tensor */
    const int H = g->H, Q = g->Q, F = g->F;
    const int shape[MC_GPT_LAYER_TENSORS][5] = {
        {H, 0, -1, sp, 1},     {H, 0, -1, sp, 1},  {3 * Q, H, 0, 0, 0}, {3 * Q, 0, 0, 0, 1},
        {H, Q, 1, 0, 0},       {H, 0, -1, sp, 1},  {H, 0, -1, sp, 1},   {H, 0, -1, sp, 1},
        {F, H, 0, 0, 0},       {F, 0, 0, 0, 1},    {H, F, 1, 0, 0},     {H, 0, -1, sp, 1},
    };
    for (c = 0; c < g->n_chunks; c++) {
        im->word[c] = im->pos[c] = im->lnf_w[c] = im->lnf_b[c] = im->out_w[c] = -1;
        if (mc_gpt_is_pre_process(g, c)) {
            /* the first stage's word embedding is one of the tied pair when PP > 1 */
            idx = mc__gpt_add_param(g, "embedding.word_embeddings.weight", g->vocab_padded, H, 0,
                                    0, 0, 0, g->tied && g->pp > 1, c, -1);
            if ((im->word[c] = idx) < 0) return idx;
            idx = mc__gpt_add_param(g, "embedding.position_embeddings.weight",
                                    g->config.max_position_embeddings, H, -1, 0, 0, 0, 0, c, -1);
            if ((im->pos[c] = idx) < 0) return idx;
        }
        for (l = 0; l < g->layers_per_chunk; l++) {
            int global = g->layer_offset[c] + l;
            for (t = 0; t < MC_GPT_LAYER_TENSORS; t++) {
                snprintf(name, sizeof name, "decoder.layers.%d.%s", global,
                         mc__gpt_tensor_name(g, t));
                idx = mc__gpt_add_param(g, name, shape[t][0], shape[t][1], shape[t][2],
                                        shape[t][3], shape[t][4], 0, 0, c, global);
                if (idx < 0) return idx;
                im->layer_params[((size_t)c * (size_t)g->layers_per_chunk + (size_t)l) *
                                     MC_GPT_LAYER_TENSORS + (size_t)t] = idx;
            }
        }
        if (mc_gpt_is_post_process(g, c)) {
            idx = mc__gpt_add_param(g, "decoder.final_layernorm.weight", H, 0, -1, sp, 1, 0, 0, c,
                                    -1);
            if ((im->lnf_w[c] = idx) < 0) return idx;
            idx = mc__gpt_add_param(g, "decoder.final_layernorm.bias", H, 0, -1, sp, 1, 0, 0, c,
                                    -1);
            if ((im->lnf_b[c] = idx) < 0) return idx;
            if (!g->tied || !mc_gpt_is_pre_process(g, c)) {
                /* untied: the output layer's own weight; tied with PP > 1: the last stage's
                   copy of the word embedding (shared: counted once by the grad norm) */
                int copy = g->tied;
                idx = mc__gpt_add_param(g, "output_layer.weight", g->vocab_padded, H, 0, 0, 0,
                                        copy, copy, c, -1);
                if ((im->out_w[c] = idx) < 0) return idx;
            }
        }
    }
    return MC_OK;
}

/* The CPU initialisation (§3.1): every shard is the slice of the TP-invariant global tensor.
   Computed on the host in fp32 (the whole flat buffer, padding 0), then converted to the
   model's dtype and uploaded once, as llm.c initialises on the host and copies to the GPU. */
static int mc__gpt_init_params(mc_gpt *g) {
    const mc_gpt_config *cfg = &g->config;
    float std = cfg->init_method_std;
    float out_std = (float)((double)std / sqrt(2.0 * (double)cfg->num_layers));
    uint64_t seed = (uint64_t)cfg->seed;
    size_t total = g->table.total, k;
    float *host = (float *)mc_calloc(total > 0 ? total : 1, sizeof(float));   /* [total] */
    void *staged = host;
    /* role[i]: the Megatron name of parameter i (a spec may rename the layer tensors' keys,
       not what they are) */
    const char **role = (const char **)mc_calloc((size_t)g->table.count + 1, sizeof *role);
    int i, c, l, t, rc;
    if (!host || !role) {
        mc_free(host);
        mc_free(role);
        return MC__FAIL(MC_ERR_NO_MEMORY, "mc_gpt_init: no host memory for %zu parameters",
                        total);
    }
    for (i = 0; i < g->table.count; i++) role[i] = g->table.info[i].name;
    for (c = 0; c < g->n_chunks; c++)
        for (l = 0; l < g->layers_per_chunk; l++)
            for (t = 0; t < MC_GPT_LAYER_TENSORS; t++)
                role[g->impl->layer_params[((size_t)c * (size_t)g->layers_per_chunk +
                                            (size_t)l) * MC_GPT_LAYER_TENSORS + (size_t)t]] =
                    mc__gpt_layer_names[t];
    for (i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i];
        float *w = host + p->offset;
        const char *dot = strrchr(role[i], '.');
        int is_norm = strstr(role[i], "layernorm.") != NULL;
        if (is_norm) {
            if (strcmp(dot, ".weight") == 0)
                for (k = 0; k < p->numel; k++) w[k] = 1.0f;
            continue;   /* norm bias 0 */
        }
        if (p->ndim == 1) continue;   /* linear biases 0 */
        if (p->shared) continue;      /* the tied copy: 0 here, the embedding after the tie */
        {
            int scaled = strstr(role[i], "linear_proj.weight") != NULL ||
                         strstr(role[i], "linear_fc2.weight") != NULL;
            mc_init_normal_shard(w, p->name, p->global_shape[0], p->global_shape[1],
                                 p->partition_dim, p->partition_stride, g->tp_rank, g->tp,
                                 scaled ? out_std : std, seed);
        }
    }
    if (g->dtype == MC_BF16) {   /* Megatron's params_dtype: the fp32 init cast to bf16 */
        mc_bf16 *b = (mc_bf16 *)host;   /* in place: element k is read before 2k is written */
        for (k = 0; k < total; k++) b[k] = mc_bf16_from_float(host[k]);
    }
    rc = g->ops->upload(g->ops, g->params, staged, mc_dtype_bytes(g->dtype, total));
    mc_free(role);
    mc_free(host);
    return rc;
}

/* §7.3: the last stage's copy starts at 0 and gets the first stage's values over the
   embedding group (Megatron all-reduces the zero copy with the original; a broadcast from the
   first stage gives the same values and works for bf16 on every backend). */
static int mc__gpt_tie_embeddings(mc_gpt *g) {
    struct mc__gpt_impl *im = g->impl;
    mc_comm *emb = mc__gpt_group(g, MC_GROUP_EMBEDDING);
    int idx = -1, rc, mine, root = -1;
    if (!g->tied || g->pp == 1 || !emb || emb->size < 2) return MC_OK;
    if (mc_gpt_is_pre_process(g, 0))
        idx = im->word[0];
    else if (mc_gpt_is_post_process(g, g->n_chunks - 1))
        idx = im->out_w[g->n_chunks - 1];
    if (idx < 0) return MC_OK;
    mine = mc_gpt_is_pre_process(g, 0) ? emb->rank : -1;
    rc = mc_host_collective(emb, MC_COLL_ALL_REDUCE, &mine, &root, 1, MC_I32, MC_MAX, 0);
    if (rc != MC_OK) return rc;
    return mc_broadcast(emb, mc__gpt_p(g, idx), g->table.info[idx].numel, g->dtype, root);
}

/* Points one layer cache into the arena (NULL pointers on the sizing pass). */
static void mc__gpt_point_cache(mc_gpt *g, mc__arena *ar, struct mc__gpt_layer_cache *c,
                                int keep_stats) {
    size_t ns = (size_t)g->Ns, n = (size_t)g->N, h = (size_t)g->H;
    memset(c, 0, sizeof *c);
    c->ln1 = mc__gpt_act_take(g, ar, ns * h);
    c->ln1_mean = mc__gpt_f32_take(ar, ns);
    c->ln1_rstd = mc__gpt_f32_take(ar, ns);
    if (g->impl->own_attention) {
        if (g->impl->attention_cache_bytes)
            c->attention = mc__arena_take(ar, g->impl->attention_cache_bytes);
    } else {
        c->qkv = mc__gpt_act_take(g, ar, n * 3u * (size_t)g->Ql);
        c->atty = mc__gpt_act_take(g, ar, n * (size_t)g->Ql);
        if (keep_stats)
            c->attn_stats = mc__gpt_f32_take(
                ar, g->ops->attention_stats(g->ops, g->S, g->B, g->NHl, g->HD));
    }
    c->res1 = mc__gpt_act_take(g, ar, ns * h);
    c->ln2 = mc__gpt_act_take(g, ar, ns * h);
    c->ln2_mean = mc__gpt_f32_take(ar, ns);
    c->ln2_rstd = mc__gpt_f32_take(ar, ns);
    c->fc1 = mc__gpt_act_take(g, ar, n * (size_t)g->Fl);
    c->gelu = mc__gpt_act_take(g, ar, n * (size_t)g->Fl);
}

/* Recompute groups of a chunk (§6.4), the same for every chunk. */
static int mc__gpt_plan_recompute(mc_gpt *g) {
    struct mc__gpt_impl *im = g->impl;
    const mc_gpt_config *cfg = &g->config;
    int nl = g->layers_per_chunk, l, k = cfg->recompute_num_layers;
    im->group_of = (int *)mc__gpt_host(g, (size_t)(nl > 0 ? nl : 1) * sizeof(int));
    im->group_start = (int *)mc__gpt_host(g, (size_t)(nl > 0 ? nl : 1) * sizeof(int));
    im->group_len = (int *)mc__gpt_host(g, (size_t)(nl > 0 ? nl : 1) * sizeof(int));
    if (!im->group_of || !im->group_start || !im->group_len) return MC_ERR_NO_MEMORY;
    for (l = 0; l < nl; l++) im->group_of[l] = -1;
    im->selective = cfg->recompute_granularity == MC_RECOMPUTE_SELECTIVE;
    if (cfg->recompute_granularity != MC_RECOMPUTE_FULL) return MC_OK;
    if (k < 1) k = 1;
    if (cfg->recompute_method == MC_RECOMPUTE_BLOCK) {
        /* each of the first k layers alone */
        for (l = 0; l < nl && l < k; l++) {
            im->group_of[l] = im->n_groups;
            im->group_start[im->n_groups] = l;
            im->group_len[im->n_groups++] = 1;
        }
    } else {
        /* uniform: consecutive groups of k layers, the last one shorter */
        for (l = 0; l < nl; l += k) {
            int len = nl - l < k ? nl - l : k, j;
            for (j = 0; j < len; j++) im->group_of[l + j] = im->n_groups;
            im->group_start[im->n_groups] = l;
            im->group_len[im->n_groups++] = len;
        }
    }
    for (l = 0; l < im->n_groups; l++)
        if (im->group_len[l] > im->max_group) im->max_group = im->group_len[l];
    return MC_OK;
}

/* The shared scratch: recompute caches, backward buffers, the TP scratch, position ids. */
static void mc__gpt_point_scratch(mc_gpt *g, mc__arena *ar, int any_post) {
    struct mc__gpt_impl *im = g->impl;
    size_t ns_h = (size_t)g->Ns * (size_t)g->H, n = (size_t)g->N;
    size_t stats = g->ops->attention_stats(g->ops, g->S, g->B, g->NHl, g->HD);
    int l;
    for (l = 0; l < im->max_group; l++) {
        mc__gpt_point_cache(g, ar, &im->rc_cache[l], 1);
        im->rc_res[l] = l > 0 ? mc__gpt_act_take(g, ar, ns_h) : NULL;
    }
    if (im->selective) {
        im->stats_scratch = mc__gpt_f32_take(ar, stats);
        im->atty_scratch = mc__gpt_act_take(g, ar, n * (size_t)g->Ql);
    }
    im->full_a = mc__gpt_act_take(g, ar, n * (size_t)g->H);
    im->full_b = mc__gpt_act_take(g, ar, n * (size_t)g->H);
    im->tmp_a = mc__gpt_act_take(g, ar, ns_h);
    im->tmp_b = mc__gpt_act_take(g, ar, ns_h);
    im->d_a = mc__gpt_act_take(g, ar, ns_h);
    im->d_b = mc__gpt_act_take(g, ar, ns_h);
    im->d_c = mc__gpt_act_take(g, ar, ns_h);
    im->d_ln = mc__gpt_act_take(g, ar, ns_h);
    im->d_qkv = mc__gpt_act_take(g, ar, n * 3u * (size_t)g->Ql);
    im->d_atty = mc__gpt_act_take(g, ar, n * (size_t)g->Ql);
    im->d_fc_a = mc__gpt_act_take(g, ar, n * (size_t)g->Fl);
    im->d_fc_b = mc__gpt_act_take(g, ar, n * (size_t)g->Fl);
    im->d_loss = mc__gpt_f32_take(ar, n);
    im->tp_scratch = mc__arena_take(ar, mc__gpt_tp_scratch_bytes(g));
    im->pos_ids = (int *)mc__arena_take(ar, n * sizeof(int));
    im->d_logits = any_post ? mc__gpt_act_take(g, ar, n * (size_t)g->vocab_local) : NULL;
    im->attention_scratch = im->own_attention && im->attention_scratch_bytes
                                ? mc__arena_take(ar, im->attention_scratch_bytes)
                                : NULL;
}

/* One micro-batch slot of one chunk. a->res and a->layer are host arrays set up before. */
static void mc__gpt_point_act(mc_gpt *g, mc__arena *ar, mc__gpt_act *a, int pre, int post) {
    struct mc__gpt_impl *im = g->impl;
    size_t ns_h = (size_t)g->Ns * (size_t)g->H, n = (size_t)g->N;
    int nl = g->layers_per_chunk, l;
    a->dinput = mc__gpt_act_take(g, ar, ns_h);
    for (l = 0; l <= nl; l++) {
        int grp = l < nl ? im->group_of[l] : -1;
        if (grp >= 0 && l != im->group_start[grp])
            a->res[l] = im->rc_res[l - im->group_start[grp]];   /* inside a group: replayed */
        else
            a->res[l] = mc__gpt_act_take(g, ar, ns_h);
    }
    for (l = 0; l < nl; l++)
        if (im->group_of[l] < 0) mc__gpt_point_cache(g, ar, &a->layer[l], im->keep_stats);
    a->tokens = pre ? (int *)mc__arena_take(ar, n * sizeof(int)) : NULL;
    if (post) {
        a->labels = (int *)mc__arena_take(ar, n * sizeof(int));
        a->lnf = mc__gpt_act_take(g, ar, ns_h);
        a->lnf_mean = mc__gpt_f32_take(ar, (size_t)g->Ns);
        a->lnf_rstd = mc__gpt_f32_take(ar, (size_t)g->Ns);
        a->logits = mc__gpt_act_take(g, ar, n * (size_t)g->vocab_local);
        a->ce_max = mc__gpt_f32_take(ar, n);
        a->ce_sum = mc__gpt_f32_take(ar, n);
        a->losses = mc__gpt_f32_take(ar, n);
        a->loss_sum = (double *)mc__arena_take(ar, sizeof(double));
    }
}

/* Sizes an arena with `point` (base NULL), allocates it, points into it. */
#define MC__GPT_ARENA(g, out_base, call)                                                   \
    do {                                                                                   \
        mc__arena ar_ = {NULL, 0};                                                         \
        mc__arena *ar = &ar_;                                                              \
        call;                                                                              \
        if (mc_ops_alloc((g)->ops, MC_MEMORY_ACTIVATIONS, &(out_base), ar_.used) != MC_OK)    \
            return MC_ERR_NO_MEMORY;                                                       \
        (g)->impl->arena_bytes += ar_.used;                                                \
        ar_.base = (char *)(out_base);                                                     \
        ar_.used = 0;                                                                      \
        call;                                                                              \
    } while (0)

static int mc__gpt_alloc_activations(mc_gpt *g) {
    struct mc__gpt_impl *im = g->impl;
    int nl = g->layers_per_chunk, c, s, l, rc, any_post = 0;
    int *pos;
    /* the CPU's attention stats are the probabilities, which selective recompute drops */
    size_t stats = g->ops->attention_stats(g->ops, g->S, g->B, g->NHl, g->HD);
    im->keep_stats = !im->selective ||
                     stats < (size_t)g->B * (size_t)g->NHl * (size_t)g->S * (size_t)g->S;
    im->rc_cache = (struct mc__gpt_layer_cache *)mc__gpt_host(
        g, (size_t)(im->max_group > 0 ? im->max_group : 1) * sizeof *im->rc_cache);
    im->rc_res = (void **)mc__gpt_host(g, (size_t)(im->max_group + 1) * sizeof(void *));
    im->act = (mc__gpt_act *)mc__gpt_host(g, (size_t)g->n_chunks * (size_t)g->n_slots *
                                                 sizeof *im->act);
    if (!im->rc_cache || !im->rc_res || !im->act) return MC_ERR_NO_MEMORY;
    for (c = 0; c < g->n_chunks; c++) any_post |= mc_gpt_is_post_process(g, c);
    MC__GPT_ARENA(g, im->scratch_arena, mc__gpt_point_scratch(g, ar, any_post));
    /* token n = s * B + b has position s: computed here, uploaded once */
    pos = (int *)mc_malloc((size_t)g->N * sizeof(int));
    if (!pos) return MC_ERR_NO_MEMORY;
    for (l = 0; l < g->N; l++) pos[l] = l / g->B;
    rc = g->ops->upload(g->ops, im->pos_ids, pos, (size_t)g->N * sizeof(int));
    mc_free(pos);
    if (rc != MC_OK) return rc;
    for (c = 0; c < g->n_chunks; c++) {
        int pre = mc_gpt_is_pre_process(g, c), post = mc_gpt_is_post_process(g, c);
        for (s = 0; s < g->n_slots; s++) {
            mc__gpt_act *a = &im->act[c * g->n_slots + s];
            a->microbatch = -1;
            a->res = (void **)mc__gpt_host(g, (size_t)(nl + 1) * sizeof(void *));
            a->layer = (struct mc__gpt_layer_cache *)mc__gpt_host(
                g, (size_t)(nl > 0 ? nl : 1) * sizeof *a->layer);
            a->group_rng = (mc_rng_states *)mc__gpt_host(
                g, (size_t)(im->n_groups > 0 ? im->n_groups : 1) * sizeof *a->group_rng);
            if (!a->res || !a->layer || !a->group_rng) return MC_ERR_NO_MEMORY;
            MC__GPT_ARENA(g, a->arena, mc__gpt_point_act(g, ar, a, pre, post));
        }
    }
    return MC_OK;
}
/* Sizes from the config and the parallel state; checks they agree. */
static int mc__gpt_setup_sizes(mc_gpt *g, const mc_gpt_desc *desc) {
    const mc_gpt_config *cfg = &g->config;
    int cfg_tp = MC__DEF(cfg->tensor_model_parallel_size, 1);
    int cfg_pp = MC__DEF(cfg->pipeline_model_parallel_size, 1);
    int cfg_v = cfg->virtual_pipeline_model_parallel_size > 1
                    ? cfg->virtual_pipeline_model_parallel_size : 1;
    int c;
    g->tp = g->pp = g->dp = 1;
    if (g->ps) {
        int ps_v = g->ps->grid.desc.vpp > 1 ? g->ps->grid.desc.vpp : 1;
        if (!g->ps->initialized)
            return MC__FAIL(MC_ERR_STATE, "mc_gpt_init: the parallel state is not initialised");
        g->tp = mc_parallel_size(g->ps, MC_GROUP_TP);
        g->tp_rank = mc_parallel_rank(g->ps, MC_GROUP_TP);
        g->pp = mc_parallel_size(g->ps, MC_GROUP_PP);
        g->pp_rank = mc_parallel_rank(g->ps, MC_GROUP_PP);
        g->dp = mc_parallel_size(g->ps, MC_GROUP_DP_CP);
        g->dp_rank = mc_parallel_rank(g->ps, MC_GROUP_DP);
        if (g->tp != cfg_tp || g->pp != cfg_pp || ps_v != cfg_v)
            return MC__FAIL(MC_ERR_INVALID_DESC,
                            "mc_gpt_init: the config's tensor_model_parallel_size (%d), "
                            "pipeline_model_parallel_size (%d) and "
                            "virtual_pipeline_model_parallel_size (%d) must equal the parallel "
                            "state's tp (%d), pp (%d) and vpp (%d)",
                            cfg_tp, cfg_pp, cfg_v, g->tp, g->pp, ps_v);
    } else if (cfg_tp != 1 || cfg_pp != 1) {
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_gpt_init: without a parallel state tensor_model_parallel_size (%d) "
                        "and pipeline_model_parallel_size (%d) must be 1", cfg_tp, cfg_pp);
    }
    g->n_chunks = cfg_v;
    g->layers_per_chunk = mc_gpt_num_layers_to_build(cfg);
    if (g->layers_per_chunk < 0) return g->layers_per_chunk;
    for (c = 0; c < g->n_chunks; c++) g->layer_offset[c] = mc_gpt_layer_offset(cfg, g->pp_rank, c);
    g->S = cfg->seq_length;
    g->B = cfg->micro_batch_size;
    g->N = g->S * g->B;
    g->sequence_parallel = cfg->sequence_parallel && g->tp > 1;
    g->Ns = g->sequence_parallel ? g->N / g->tp : g->N;
    g->H = cfg->hidden_size;
    g->NH = cfg->num_attention_heads;
    g->HD = cfg->kv_channels;
    g->Q = g->NH * g->HD;
    g->F = cfg->ffn_hidden_size;
    g->NHl = g->NH / g->tp;
    g->Ql = g->Q / g->tp;
    g->Fl = g->F / g->tp;
    g->vocab_padded = cfg->padded_vocab_size;
    g->vocab_local = g->vocab_padded / g->tp;
    g->vocab_start = g->tp_rank * g->vocab_local;
    g->tied = !cfg->untie_embeddings_and_output_weights;
    g->p2p_elems = (size_t)g->Ns * (size_t)g->H;
    if (g->vocab_padded % g->tp != 0 || g->vocab_padded < cfg->vocab_size)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_gpt_init: padded_vocab_size (%d) must be >= vocab_size (%d) and "
                        "divisible by tensor_model_parallel_size (%d)",
                        g->vocab_padded, cfg->vocab_size, g->tp);
    if (g->NH % g->tp || g->F % g->tp || (g->sequence_parallel && g->S % g->tp))
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_gpt_init: num_attention_heads (%d), ffn_hidden_size (%d) (and "
                        "seq_length (%d) under sequence parallelism) must be divisible by "
                        "tensor_model_parallel_size (%d)", g->NH, g->F, g->S, g->tp);
    (void)desc;
    return MC_OK;
}

MC_API void mc_gpt_destroy(mc_gpt *g) {
    struct mc__gpt_impl *im;
    int i;
    if (!g || !g->impl) return;
    im = g->impl;
    if (im->act)
        for (i = 0; i < g->n_chunks * g->n_slots; i++) mc__ops_free(g->ops, im->act[i].arena);
    mc__ops_free(g->ops, im->scratch_arena);
    mc__ops_free(g->ops, g->params);
    mc__ops_free(g->ops, g->grads);
    for (i = im->n_host - 1; i >= 0; i--) mc_free(im->host[i]);
    mc_free(im->host);
    mc_param_table_destroy(&g->table);
    mc_free(im);
    memset(g, 0, sizeof *g);
}

MC_API size_t mc_gpt_memory(const mc_gpt *g, size_t *activation_bytes) {
    size_t params = 0;
    if (activation_bytes) *activation_bytes = 0;
    if (!g || !g->impl) return 0;
    params = mc_dtype_bytes(g->dtype, g->table.total) + sizeof(float) * g->table.total;
    if (activation_bytes) *activation_bytes = g->impl->arena_bytes;
    return params + g->impl->arena_bytes;
}

/* Every slot of the table from alloc to adamw is a function (a backend may leave ops it lacks
   NULL); the account after them may be NULL. */
static int mc__ops_check_complete(const mc_ops *o, const char *fn) {
    const void *const *slot = (const void *const *)(const void *)&o->alloc;
    size_t n = (offsetof(mc_ops, account) - offsetof(mc_ops, alloc)) / sizeof(void *), i;
    for (i = 0; i < n; i++)
        if (!slot[i])
            return MC__FAIL(MC_ERR_UNSUPPORTED, "%s: the '%s' op table lacks op #%zu (of %zu "
                            "after alloc): this build of the backend cannot train a model", fn,
                            o->name ? o->name : "?", i, n);
    return MC_OK;
}

/* Every communicator the model uses must work on the model's memory (one memory owner). */
static int mc__gpt_check_memory(const mc_gpt *g) {
    const mc_ops *mem;
    if (!g->ps || !g->ps->world) return MC_OK;
    mem = mc_comm_memory(g->ps->world);
    if (mc_ops_same_memory(mem, g->ops)) return MC_OK;
    return MC__FAIL(MC_ERR_INVALID_DESC,
                    "mc_gpt_init: the op table '%s' and the communicators' memory ('%s', "
                    "mc_comm_memory of the world) are not the same memory; create the world "
                    "with mc_comm_desc.memory = the model's table, or give the model "
                    "mc_comm_memory(world)",
                    g->ops->name ? g->ops->name : "?", mem && mem->name ? mem->name : "?");
}

/* The submodules the layers run (impl->spec): the given spec, checked; its own attention
   unless attention_accepts refuses this model's shape, in which case the local attention
   runs in every layer and the model says why (gpt->attention_fallback, a warning). */
static int mc__gpt_resolve_spec(mc_gpt *g) {
    struct mc__gpt_impl *im = g->impl;
    const mc_transformer_spec *sp = g->spec, *local = mc_transformer_spec_local();
    const char *name = sp->name ? sp->name : "(unnamed)";
    int rc;
    if (!sp->norm_forward || !sp->norm_backward || !sp->attention_forward ||
        !sp->attention_backward || !sp->mlp_forward || !sp->mlp_backward)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_gpt_init: spec '%s' must set all six submodule functions (norm, "
                        "attention and mlp, forward and backward); copy "
                        "mc_transformer_spec_local() and replace the ones you bring", name);
    if ((rc = mc__gpt_check_tensor_names(g)) != MC_OK) return rc;
    im->spec = *sp;
    im->own_attention = sp->attention_forward != local->attention_forward;
    if (im->own_attention && sp->attention_accepts) {
        char why[sizeof g->attention_fallback_why];
        why[0] = '\0';
        if (sp->attention_accepts(g, why, sizeof why) != 0) {
            g->attention_fallback = 1;
            snprintf(g->attention_fallback_why, sizeof g->attention_fallback_why, "%s",
                     why[0] ? why : "(no reason given)");
            im->spec.attention_forward = local->attention_forward;
            im->spec.attention_backward = local->attention_backward;
            im->own_attention = 0;
            MC__WARN("mc_gpt_init: spec '%s' refuses this model's attention (%s): every "
                     "layer runs the local attention instead", name, g->attention_fallback_why);
        }
    }
    if (im->own_attention) {
        im->attention_cache_bytes = sp->attention_cache_bytes ? sp->attention_cache_bytes(g) : 0;
        im->attention_scratch_bytes =
            sp->attention_scratch_bytes ? sp->attention_scratch_bytes(g) : 0;
    }
    return MC_OK;
}

MC_API int mc_gpt_init(mc_gpt *g, const mc_gpt_desc *desc) {
    char report[2048];
    int violations, rc, c;
    if (!g || !desc) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_gpt_init: gpt and desc must be set");
    memset(g, 0, sizeof *g);
    g->config = desc->config;
    if (g->config.padded_vocab_size == 0 &&
        (rc = mc_gpt_config_resolve(&g->config, &desc->config)) != MC_OK)
        return rc;
    report[0] = '\0';
    violations = mc_gpt_config_validate(&g->config, report, sizeof report);
    if (violations < 0) return violations;
    if (violations > 0)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_gpt_init: the config breaks %d rule(s):\n%s",
                        violations, report);
    g->ps = desc->ps;
    g->ops = desc->ops ? desc->ops : mc_ops_cpu();
    g->spec = desc->spec ? desc->spec : mc_transformer_spec_local();
    g->n_slots = MC__DEF(desc->n_slots, 1);
    g->gather_logits = desc->gather_logits;
    g->dtype = desc->dtype;
    g->tap = desc->tap;
    g->tap_user = desc->tap_user;
    g->training = 1;
    if (g->n_slots < 1)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_gpt_init: n_slots (%d) must be >= 1",
                        g->n_slots);
    if (g->dtype != MC_F32 && g->dtype != MC_BF16)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_gpt_desc.dtype (%d) must be MC_F32 or MC_BF16 "
                        "(Megatron's --bf16)", (int)g->dtype);
    if ((rc = mc__ops_check_complete(g->ops, "mc_gpt_init")) != MC_OK) return rc;
    if ((rc = mc__gpt_check_memory(g)) != MC_OK) return rc;
    if ((rc = mc__gpt_setup_sizes(g, desc)) != MC_OK) return rc;
    for (c = 0; c < MC_GPT_MAX_CHUNKS; c++) g->grad_sync[c] = 1;
    g->impl = (struct mc__gpt_impl *)mc_calloc(1, sizeof *g->impl);
    if (!g->impl) return MC__FAIL(MC_ERR_NO_MEMORY, "mc_gpt_init: out of memory");
    g->impl->layer_params = (int *)mc__gpt_host(
        g, (size_t)g->n_chunks * (size_t)(g->layers_per_chunk + 1) * MC_GPT_LAYER_TENSORS *
               sizeof(int));
    if (!g->impl->layer_params) rc = MC_ERR_NO_MEMORY;
    if (rc == MC_OK) rc = mc__gpt_resolve_spec(g);
    if (rc == MC_OK) rc = mc__gpt_register(g);
    if (rc == MC_OK) {
        mc_param_layout_desc lay;
        memset(&lay, 0, sizeof lay);
        lay.dp_size = g->dp;
        lay.distributed_optimizer = desc->distributed_optimizer;
        lay.bucket_size = desc->bucket_size;
        lay.pp_rank = g->pp_rank;
        rc = mc_param_table_layout(&g->table, &lay);
    }
    if (rc == MC_OK) {
        g->params = mc__ops_alloc(g->ops, MC_MEMORY_PARAMETERS,
                                  mc_dtype_bytes(g->dtype, g->table.total));
        g->grads = (float *)mc__ops_alloc(g->ops, MC_MEMORY_GRADIENTS,
                                          sizeof(float) * g->table.total);
        if (!g->params || !g->grads) rc = MC_ERR_NO_MEMORY;
    }
    if (rc == MC_OK) rc = mc__gpt_init_params(g);
    if (rc == MC_OK) rc = mc__gpt_tie_embeddings(g);
    if (rc == MC_OK) {
        int ep = g->ps ? g->ps->coords.ep : 0, etp = g->ps ? g->ps->coords.etp : 0;
        rc = mc_rng_tracker_seed_megatron(&g->rng, g->config.seed, g->tp_rank, g->pp_rank, ep,
                                          etp, g->dp_rank, 0);
    }
    if (rc == MC_OK) rc = mc__gpt_plan_recompute(g);
    if (rc == MC_OK) rc = mc__gpt_alloc_activations(g);
    if (rc == MC_OK) rc = mc_gpt_zero_grad(g);
    if (rc != MC_OK) {
        if (rc == MC_ERR_NO_MEMORY) MC__FAIL(rc, "mc_gpt_init: out of memory (%s)",
                                             mc_last_error());
        mc_gpt_destroy(g);
        return rc;
    }
    return MC_OK;
}

/* @model:implementation end */

/* =============================================================================================
   distributed, optimizer, dist_checkpointing (implementation) */

/* @ddp:implementation begin */

// ---------------------------------------------------------------------------------------------
// >>distributed

enum { MC__DDP_IDLE = 0, MC__DDP_IN_FLIGHT, MC__DDP_DONE };

static void mc__ddp_release(mc_ddp *ddp) {
    mc_free(ddp->events);
    mc_free(ddp->bucket_of);
    mc_free(ddp->ready);
    mc_free(ddp->bucket_ready);
    mc_free(ddp->bucket_state);
    mc_free(ddp->requests);
    memset(ddp, 0, sizeof *ddp);
}

static int mc__ddp_check(const mc_ddp *ddp, const char *fn) {
    if (!ddp || !ddp->desc.table || !ddp->bucket_state)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: ddp is NULL or not initialised (mc_ddp_init)", fn);
    return MC_OK;
}

static int mc__ddp_validate(const mc_ddp_desc *d) {
    const mc_param_table *t = d->table;
    int dp = d->dp ? d->dp->size : 1;
    if (!t) return MC__FAIL(MC_ERR_INVALID_DESC, "mc_ddp_desc.table is required");
    if (!t->order && t->count > 0)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_ddp_desc.table: %d params but no layout "
                        "(call mc_param_table_layout first)", t->count);
    if (!d->grads && t->total > 0)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_ddp_desc.grads is required (%zu elements)",
                        t->total);
    if (!d->ops) return MC__FAIL(MC_ERR_INVALID_DESC, "mc_ddp_desc.ops: no op table");
    if (d->dp && !mc_ops_same_memory(mc_comm_memory(d->dp), d->ops))
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_ddp_desc.ops ('%s') and the dp communicator's memory ('%s') are not "
                        "the same memory: the grads must be buffers the communicator reduces "
                        "(one memory owner)", d->ops->name ? d->ops->name : "?",
                        mc_comm_memory(d->dp)->name ? mc_comm_memory(d->dp)->name : "?");
    if (d->distributed_optimizer != t->layout.distributed_optimizer)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_ddp_desc.distributed_optimizer (%d) differs from "
                        "the table's layout (%d): the padding would not fit the shards",
                        d->distributed_optimizer, t->layout.distributed_optimizer);
    if (!(d->gradient_scaling_factor >= 0.0f) || d->gradient_scaling_factor > 1e30f)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_ddp_desc.gradient_scaling_factor (%g) must be a "
                        "finite value >= 0 (0 selects 1/size(dp))",
                        (double)d->gradient_scaling_factor);
    if (d->gradient_scaling_factor > 0.0f && d->calculate_per_token_loss)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_ddp_desc.gradient_scaling_factor (%g) cannot be "
                        "combined with calculate_per_token_loss (the factor is 1 then: finalize "
                        "divides by the token count)", (double)d->gradient_scaling_factor);
    if (d->distributed_optimizer && dp != t->layout.dp_size)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_ddp_desc.dp: size %d, but the table was laid out "
                        "for dp_size %d (the buckets must split into equal shards)", dp,
                        t->layout.dp_size);
    return MC_OK;
}

MC_API int mc_ddp_init(mc_ddp *ddp, const mc_ddp_desc *desc) {
    const mc_param_table *t;
    size_t nb, np;
    int rc, b, k;
    if (!ddp || !desc) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_ddp_init: ddp and desc must be set");
    memset(ddp, 0, sizeof *ddp);
    ddp->desc = *desc;
    if (!ddp->desc.ops) ddp->desc.ops = ddp->desc.dp ? mc_comm_memory(ddp->desc.dp) : mc_ops_cpu();
    if ((rc = mc__ddp_validate(&ddp->desc)) != MC_OK) {
        memset(ddp, 0, sizeof *ddp);
        return rc;
    }
    t = ddp->desc.table;
    ddp->dp_size = ddp->desc.dp ? ddp->desc.dp->size : 1;
    ddp->dp_rank = ddp->desc.dp ? ddp->desc.dp->rank : 0;
    ddp->scale = ddp->desc.calculate_per_token_loss    ? 1.0f
                 : ddp->desc.gradient_scaling_factor > 0 ? ddp->desc.gradient_scaling_factor
                                                         : 1.0f / (float)ddp->dp_size;
    nb = (size_t)(t->n_buckets > 0 ? t->n_buckets : 1);
    np = (size_t)(t->count > 0 ? t->count : 1);
    ddp->events = (mc_ddp_event *)mc_calloc(2 * nb, sizeof *ddp->events);
    ddp->bucket_of = (int *)mc_calloc(np, sizeof *ddp->bucket_of);
    ddp->ready = (unsigned char *)mc_calloc(np, 1);
    ddp->bucket_ready = (int *)mc_calloc(nb, sizeof *ddp->bucket_ready);
    ddp->bucket_state = (int *)mc_calloc(nb, sizeof *ddp->bucket_state);
    ddp->requests = (mc_request **)mc_calloc(nb, sizeof *ddp->requests);
    if (!ddp->events || !ddp->bucket_of || !ddp->ready || !ddp->bucket_ready ||
        !ddp->bucket_state || !ddp->requests) {
        mc__ddp_release(ddp);
        return MC__FAIL(MC_ERR_NO_MEMORY, "mc_ddp_init: out of memory (%d buckets)", t->n_buckets);
    }
    for (b = 0; b < t->n_buckets; b++)
        for (k = 0; k < t->buckets[b].n_params; k++)
            ddp->bucket_of[t->order[t->buckets[b].first_param + k]] = b;
    return MC_OK;
}

static int mc__ddp_in_flight(const mc_ddp *ddp) {
    int b;
    for (b = 0; b < ddp->desc.table->n_buckets; b++)
        if (ddp->bucket_state[b] == MC__DDP_IN_FLIGHT) return b;
    return -1;
}

MC_API int mc_ddp_destroy(mc_ddp *ddp) {
    int b;
    if (!ddp || !ddp->bucket_state) return MC_OK;   /* never initialised, or destroyed */
    if ((b = mc__ddp_in_flight(ddp)) >= 0)
        return MC__FAIL(MC_ERR_BUSY, "mc_ddp_destroy: bucket %d's collective is still in flight "
                        "(call mc_ddp_finish_grad_sync first)", b);
    mc__ddp_release(ddp);
    return MC_OK;
}

MC_API int mc_ddp_zero_grad(mc_ddp *ddp) {
    const mc_param_table *t;
    int rc, b;
    if ((rc = mc__ddp_check(ddp, "mc_ddp_zero_grad")) != MC_OK) return rc;
    if ((b = mc__ddp_in_flight(ddp)) >= 0)
        return MC__FAIL(MC_ERR_BUSY, "mc_ddp_zero_grad: bucket %d's collective is still in flight "
                        "and writes into the grads (call mc_ddp_finish_grad_sync first)", b);
    t = ddp->desc.table;
    if (t->total > 0 &&
        (rc = ddp->desc.ops->fill(ddp->desc.ops, ddp->desc.grads, 0.0f, t->total, MC_F32)) !=
            MC_OK)
        return rc;
    memset(ddp->ready, 0, (size_t)(t->count > 0 ? t->count : 1));
    for (b = 0; b < t->n_buckets; b++) {
        ddp->bucket_ready[b] = 0;
        ddp->bucket_state[b] = MC__DDP_IDLE;
    }
    memset(ddp->grad_sync, 0, sizeof ddp->grad_sync);
    ddp->params_ready = 0;
    ddp->n_events = 0;
    ddp->finished = 0;
    return MC_OK;
}

MC_API int mc_ddp_set_grad_sync(mc_ddp *ddp, int chunk, int enable) {
    int rc, c;
    if ((rc = mc__ddp_check(ddp, "mc_ddp_set_grad_sync")) != MC_OK) return rc;
    if (chunk < -1 || chunk >= MC_MAX_VPP)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_ddp_set_grad_sync: chunk (%d) must be -1 (all) or "
                        "in [0, MC_MAX_VPP = %d)", chunk, MC_MAX_VPP);
    for (c = 0; c < MC_MAX_VPP; c++)
        if (chunk == -1 || chunk == c) ddp->grad_sync[c] = enable ? 1 : 0;
    return MC_OK;
}

MC_API int mc_ddp_shard(const mc_ddp *ddp, int bucket, size_t *start, size_t *end) {
    const mc_bucket *bk;
    size_t size;
    int rc;
    if ((rc = mc__ddp_check(ddp, "mc_ddp_shard")) != MC_OK) return rc;
    if (bucket < 0 || bucket >= ddp->desc.table->n_buckets)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_ddp_shard: bucket (%d) must be in [0, %d)", bucket,
                        ddp->desc.table->n_buckets);
    bk = &ddp->desc.table->buckets[bucket];
    if (!ddp->desc.distributed_optimizer) {
        *start = bk->start;
        *end = bk->end;
        return MC_OK;
    }
    size = (bk->end - bk->start) / (size_t)ddp->dp_size;
    *start = bk->start + (size_t)ddp->dp_rank * size;
    *end = *start + size;
    return MC_OK;
}

static void mc__ddp_log(mc_ddp *ddp, mc_ddp_event_kind kind, int bucket) {
    if (ddp->n_events >= 2 * ddp->desc.table->n_buckets) return;   /* cannot happen: 2 a bucket */
    ddp->events[ddp->n_events].kind = kind;
    ddp->events[ddp->n_events].bucket = bucket;
    ddp->events[ddp->n_events].params_ready = ddp->params_ready;
    ddp->n_events++;
}

/* Scales bucket b (by 1/DP or the desc's factor) and starts (async) or runs (blocking) its SUM
   collective. */
static int mc__ddp_launch_bucket(mc_ddp *ddp, int b, int async) {
    const mc_bucket *bk = &ddp->desc.table->buckets[b];
    float *data = ddp->desc.grads + bk->start;                 /* [end - start] */
    size_t n = bk->end - bk->start, shard_start, shard_end;
    mc_request **req = async ? &ddp->requests[b] : NULL;
    int rc = MC_OK;
    if (ddp->scale != 1.0f &&
        (rc = ddp->desc.ops->scale(ddp->desc.ops, data, ddp->scale, n, MC_F32)) != MC_OK)
        return rc;
    if (ddp->desc.dp && ddp->desc.distributed_optimizer) {
        mc_ddp_shard(ddp, b, &shard_start, &shard_end);
        rc = async ? mc_reduce_scatter_async(ddp->desc.dp, data, ddp->desc.grads + shard_start,
                                             shard_end - shard_start, MC_F32, MC_SUM, req)
                   : mc_reduce_scatter(ddp->desc.dp, data, ddp->desc.grads + shard_start,
                                       shard_end - shard_start, MC_F32, MC_SUM);
    } else if (ddp->desc.dp) {
        rc = async ? mc_all_reduce_async(ddp->desc.dp, data, data, n, MC_F32, MC_SUM, req)
                   : mc_all_reduce(ddp->desc.dp, data, data, n, MC_F32, MC_SUM);
    }
    if (rc != MC_OK) return rc;
    ddp->bucket_state[b] = async && ddp->requests[b] ? MC__DDP_IN_FLIGHT : MC__DDP_DONE;
    mc__ddp_log(ddp, async ? MC_DDP_LAUNCH : MC_DDP_SYNC, b);
    return MC_OK;
}

/* The launch as a timeline span "ddp_bucket" (its collective inside it). */
static int mc__ddp_launch(mc_ddp *ddp, int b, int async) {
    long long span = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, "ddp_bucket", b,
                                             ddp->desc.table->buckets[b].chunk, NULL, 0, 1)
                               : -1;
    int rc = mc__ddp_launch_bucket(ddp, b, async);
    if (span >= 0) mc__tl_close(span, rc, ddp->desc.ops, NULL);
    return rc;
}

MC_API int mc_ddp_register_grad_ready(mc_ddp *ddp, int param) {
    const mc_param_table *t;
    int rc, b;
    if ((rc = mc__ddp_check(ddp, "mc_ddp_register_grad_ready")) != MC_OK) return rc;
    t = ddp->desc.table;
    if (param < 0 || param >= t->count)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_ddp_register_grad_ready: param (%d) must be in "
                        "[0, %d)", param, t->count);
    if (!ddp->desc.overlap_grad_reduce || !ddp->grad_sync[t->info[param].chunk]) return MC_OK;
    if (ddp->ready[param])
        return MC__FAIL(MC_ERR_STATE, "mc_ddp_register_grad_ready: the grad of %s was registered "
                        "twice in one iteration (missing mc_ddp_zero_grad?)", t->info[param].name);
    b = ddp->bucket_of[param];
    if (ddp->bucket_state[b] != MC__DDP_IDLE)
        return MC__FAIL(MC_ERR_STATE, "mc_ddp_register_grad_ready: %s is ready after its bucket %d "
                        "was already reduced (its grad would be lost)", t->info[param].name, b);
    ddp->ready[param] = 1;
    ddp->params_ready++;
    if (++ddp->bucket_ready[b] < t->buckets[b].n_params) return MC_OK;
    return mc__ddp_launch(ddp, b, 1);
}

MC_API int mc_ddp_start_grad_sync(mc_ddp *ddp) {
    int rc, b;
    if ((rc = mc__ddp_check(ddp, "mc_ddp_start_grad_sync")) != MC_OK) return rc;
    for (b = 0; b < ddp->desc.table->n_buckets; b++)
        if (ddp->bucket_state[b] == MC__DDP_IDLE &&
            (rc = mc__ddp_launch(ddp, b, ddp->desc.overlap_grad_reduce)) != MC_OK)
            return rc;
    return MC_OK;
}

static int mc__ddp_finish(mc_ddp *ddp);

MC_API int mc_ddp_finish_grad_sync(mc_ddp *ddp) {
    long long span;
    int rc;
    if ((rc = mc__ddp_check(ddp, "mc_ddp_finish_grad_sync")) != MC_OK) return rc;
    span = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, "finish_grad_sync", -1, -1, NULL, 0, 1) : -1;
    rc = mc__ddp_finish(ddp);
    if (span >= 0) mc__tl_close(span, rc, ddp->desc.ops, NULL);
    return rc;
}

static int mc__ddp_finish(mc_ddp *ddp) {
    const mc_param_table *t = ddp->desc.table;
    int rc, b;
    if (ddp->finished)
        return MC__FAIL(MC_ERR_STATE, "mc_ddp_finish_grad_sync: the grads are already reduced; "
                        "call mc_ddp_zero_grad before the next iteration");
    if ((rc = mc_ddp_start_grad_sync(ddp)) != MC_OK) return rc;
    for (b = 0; b < t->n_buckets; b++) {
        if (ddp->bucket_state[b] != MC__DDP_IN_FLIGHT) continue;
        rc = mc_wait(ddp->requests[b]);   /* frees the request, also on error */
        ddp->requests[b] = NULL;
        ddp->bucket_state[b] = MC__DDP_DONE;
        if (rc != MC_OK) return rc;
        mc__ddp_log(ddp, MC_DDP_WAIT, b);
    }
    ddp->finished = 1;
    return MC_OK;
}

/* The params finalize all-reduces over TP under SP (a fault may leave some out). */
static int mc__finalize_sp_param(const mc_param_info *p) {
#if defined(MC_FAULT_HOOKS)
    if (mc__fault_on_param(MC_FAULT_NO_SP_GRAD_SYNC, p->name)) return 0;
#endif
    return p->sequence_parallel;
}

#if defined(MC_FAULT_HOOKS)
static int mc__fault_skip_grad_sync = 0;
MC_API void mc_fault_finalize_skip_grad_sync(int on) { mc__fault_skip_grad_sync = on != 0; }
#endif

/* Step 3 of finalize: one all-reduce over TP of every sequence_parallel param's grad, packed. */
static int mc__finalize_sequence_parallel(const mc_ops *ops, mc_comm *tp,
                                          const mc_param_table *t, float *grads) {
    size_t n = 0, at = 0;
    float *packed;
    int i, rc;
    for (i = 0; i < t->count; i++)
        if (mc__finalize_sp_param(&t->info[i])) n += t->info[i].numel;
    if (n == 0) return MC_OK;
    packed = (float *)mc__ops_alloc(ops, MC_MEMORY_COMMUNICATION, n * sizeof *packed);   /* [n]: the flagged grads */
    if (!packed) return MC__FAIL(MC_ERR_NO_MEMORY, "finalize_model_grads: out of memory packing "
                                 "%zu sequence-parallel grads", n);
    for (i = 0, rc = MC_OK; rc == MC_OK && i < t->count; i++)
        if (mc__finalize_sp_param(&t->info[i])) {
            rc = ops->copy(ops, packed + at, grads + t->info[i].offset, t->info[i].numel, MC_F32,
                           MC_F32);
            at += t->info[i].numel;
        }
    if (rc == MC_OK) rc = mc_all_reduce(tp, packed, packed, n, MC_F32, MC_SUM);
    for (i = 0, at = 0; rc == MC_OK && i < t->count; i++)
        if (mc__finalize_sp_param(&t->info[i])) {
            rc = ops->copy(ops, grads + t->info[i].offset, packed + at, t->info[i].numel, MC_F32,
                           MC_F32);
            at += t->info[i].numel;
        }
    mc__ops_free(ops, packed);
    return rc;
}

/* Step 4 of finalize: the tied word embedding's grad summed over the embedding group.

   Under the distributed optimizer this runs AFTER the DP reduce-scatter of step 1 (Megatron's
   order), so each stage holds a valid sum only in its own shard of the embedding's bucket,
   and adding the two stages' buffers is right only if DP rank d owns the same elements of
   the embedding on the first and on the last stage. That is what the own bucket buys
   (mc_param_table_layout, Megatron issue #844): on both stages the embedding is alone in its
   bucket, at bucket offset 0, with the same numel and so the same padded size, so shard d is
   the same element range [d*size/DP, (d+1)*size/DP) of the embedding on both. Had it shared
   a bucket with the other params of its stage (different on the two stages), the shard
   boundaries would cut it at different elements and the sum would add a reduced piece to a
   stale, unreduced one. */
static int mc__finalize_embedding(mc_comm *embd, const mc_param_table *t, float *grads) {
    int i, rc;
#if defined(MC_FAULT_HOOKS)
    if (mc__fault.kind == MC_FAULT_NO_EMBEDDING_GRAD_SYNC) return MC_OK;
#endif
    for (i = 0; i < t->count; i++) {
        if (!t->info[i].shared_embedding) continue;
        rc = mc_all_reduce(embd, grads + t->info[i].offset, grads + t->info[i].offset,
                           t->info[i].numel, MC_F32, MC_SUM);
        if (rc != MC_OK) return rc;
    }
    return MC_OK;
}

/* Step 7: the loss was summed over tokens; divide by the global token count. */
static int mc__finalize_per_token(const mc_parallel_state *ps, mc_comm *dp, const mc_ops *ops,
                                  const mc_param_table *t, float *grads, double *num_tokens) {
    mc_comm *pp = ps ? mc_parallel_group(ps, MC_GROUP_PP) : NULL;
    int rc;
    /* host values: staged through the communicators' memory (device scalars on nccl) */
    if (pp && (rc = mc_host_collective(pp, MC_COLL_BROADCAST, num_tokens, num_tokens, 1, MC_F64,
                                       MC_SUM, pp->size - 1)) != MC_OK)
        return rc;
    if (dp && (rc = mc_host_collective(dp, MC_COLL_ALL_REDUCE, num_tokens, num_tokens, 1, MC_F64,
                                       MC_SUM, 0)) != MC_OK)
        return rc;
    if (t->total > 0)
        return ops->scale(ops, grads, (float)(1.0 / (*num_tokens > 1.0 ? *num_tokens : 1.0)),
                          t->total, MC_F32);
    return MC_OK;
}

#if defined(MC_FAULT_HOOKS)
static int mc__fault_skip_embedding_sync = 0;
MC_API void mc_fault_finalize_skip_embedding_sync(int skip) {
    mc__fault_skip_embedding_sync = skip != 0;
}
#endif

MC_API int mc_finalize_model_grads(const mc_parallel_state *ps, mc_ddp *ddp,
                                   const mc_param_table *table, float *grads,
                                   int sequence_parallel, double *num_tokens) {
    const mc_ops *ops = ddp ? ddp->desc.ops : mc_ops_cpu();
    mc_comm *tp = ps ? mc_parallel_group(ps, MC_GROUP_TP) : NULL;
    mc_comm *embd = ps ? mc_parallel_group(ps, MC_GROUP_EMBEDDING) : NULL;
    mc_comm *dp = ddp ? ddp->desc.dp : (ps ? mc_parallel_group(ps, MC_GROUP_DP_CP) : NULL);
    long long span, step;
    int rc;
    if (!table && ddp) table = ddp->desc.table;
    if (!grads && ddp) grads = ddp->desc.grads;
    if (!table || (!grads && table->total > 0))
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_finalize_model_grads: no table or grads (pass "
                        "them, or a ddp that holds them)");
    if (!table->order && table->count > 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_finalize_model_grads: the table has no layout");
    span = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, "finalize_model_grads", -1, -1, NULL, 0, 1)
                     : -1;
    rc = MC_OK;
#if defined(MC_FAULT_HOOKS)
    if (mc__fault_skip_grad_sync) ddp = NULL;   /* the fault: step 1 left to the caller */
#endif
    if (ddp) rc = mc_ddp_finish_grad_sync(ddp);                                    /* 1 */
    if (rc == MC_OK && sequence_parallel && tp && tp->size > 1) {                   /* 3 */
        step = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, "sp_grad_all_reduce", -1, -1, NULL, 0, 1)
                         : -1;
        rc = mc__finalize_sequence_parallel(ops, tp, table, grads);
        if (step >= 0) mc__tl_close(step, rc, ops, NULL);
    }
#if defined(MC_FAULT_HOOKS)
    if (mc__fault_skip_embedding_sync) embd = NULL;   /* the fault: step 4 left out */
#endif
    if (rc == MC_OK && embd && embd->size > 1) {                                    /* 4 */
        step = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, "embedding_grad_all_reduce", -1, -1, NULL,
                                       0, 1)
                         : -1;
        rc = mc__finalize_embedding(embd, table, grads);
        if (step >= 0) mc__tl_close(step, rc, ops, NULL);
    }
    /* 5: the position-embedding group has one member (the first stage) in a GPT. */
    if (rc == MC_OK && num_tokens) {                                                /* 7 */
        step = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, "num_tokens", -1, -1, NULL, 0, 1) : -1;
        rc = mc__finalize_per_token(ps, dp, ops, table, grads, num_tokens);
        if (step >= 0) mc__tl_close(step, rc, ops, NULL);
    }
    if (span >= 0) mc__tl_close(span, rc, ops, NULL);
    return rc;
}

/* @ddp:implementation end */

/* @optimizer:implementation begin */

// ---------------------------------------------------------------------------------------------
// >>optimizer

#include <math.h>

#define MC__OPT_PI 3.14159265358979323846
#define MC__OPT_CLIP_EPS 1e-6   /* Megatron: clip_coeff = max_norm / (total_norm + 1e-6) */

static void mc__opt_defaults(mc_optimizer_desc *d) {
    d->lr_decay_iters = MC__DEF(d->lr_decay_iters, d->train_iters);
    d->weight_decay = MC__DEF(d->weight_decay, 0.01f);   /* negative (off) stays negative */
    d->beta1 = MC__DEF(d->beta1, 0.9f);
    d->beta2 = MC__DEF(d->beta2, 0.999f);
    d->eps = MC__DEF(d->eps, 1e-8f);
    d->clip_grad = MC__DEF(d->clip_grad, 1.0f);         /* negative: off (Megatron's 0) */
    if (!d->ops && d->ddp) d->ops = d->ddp->desc.ops;
}

MC_API double mc_optimizer_lr_at(const mc_optimizer_desc *desc, long long num_steps) {
    mc_optimizer_desc d;
    double max_lr, min_lr, ratio, coeff;
    if (!desc) return 0.0;
    d = *desc;
    mc__opt_defaults(&d);
    max_lr = d.lr;
    min_lr = d.min_lr;
    if (d.lr_warmup_iters > 0 && num_steps <= d.lr_warmup_iters)
        return d.lr_warmup_init +
               (max_lr - d.lr_warmup_init) * (double)num_steps / (double)d.lr_warmup_iters;
    /* No decay span (or none after the warmup): constant, as Megatron's 'constant' style. */
    if (d.lr_decay_style == MC_LR_DECAY_CONSTANT || d.lr_decay_iters <= d.lr_warmup_iters)
        return max_lr;
    if (num_steps > d.lr_decay_iters) return min_lr;
    ratio = (double)(num_steps - d.lr_warmup_iters) /
            (double)(d.lr_decay_iters - d.lr_warmup_iters);
    coeff = d.lr_decay_style == MC_LR_DECAY_LINEAR ? 1.0 - ratio
                                                   : 0.5 * (cos(MC__OPT_PI * ratio) + 1.0);
    return min_lr + coeff * (max_lr - min_lr);
}

static int mc__opt_validate(const mc_optimizer_desc *d) {
    const mc_param_table *t;
    if (!d->ddp || !d->ddp->bucket_state)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc.ddp is required (an initialised "
                        "mc_ddp: it holds the table, the grads and the DP group)");
    t = d->ddp->desc.table;
    if (!d->params && t->total > 0)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc.params is required (%zu elements)",
                        t->total);
    if (!(d->lr > 0.0f))
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc.lr (%g) is required and must be "
                        "> 0", (double)d->lr);
    if (d->min_lr < 0.0f || d->min_lr > d->lr)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "mc_optimizer_desc.min_lr (%g) must be in [0, lr = %g] (Megatron asserts "
                        "min_lr >= 0 and max_lr >= min_lr)", (double)d->min_lr, (double)d->lr);
    if (d->lr_warmup_iters < 0 || d->lr_decay_iters < 0 || d->train_iters < 0)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc: lr_warmup_iters (%lld), "
                        "lr_decay_iters (%lld) and train_iters (%lld) must be >= 0",
                        d->lr_warmup_iters, d->lr_decay_iters, d->train_iters);
    if (d->lr_decay_style != MC_LR_DECAY_CONSTANT && d->lr_decay_iters > 0 &&
        d->lr_warmup_iters >= d->lr_decay_iters)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc.lr_warmup_iters (%lld) must be < "
                        "lr_decay_iters (%lld) (Megatron: lr_warmup_steps < lr_decay_steps)",
                        d->lr_warmup_iters, d->lr_decay_iters);
    if ((int)d->lr_decay_style < 0 || (int)d->lr_decay_style > (int)MC_LR_DECAY_CONSTANT)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc.lr_decay_style (%d) is not an "
                        "mc_lr_decay_style", (int)d->lr_decay_style);
    if (!(d->beta1 >= 0.0f && d->beta1 < 1.0f) || !(d->beta2 >= 0.0f && d->beta2 < 1.0f))
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc: beta1 (%g) and beta2 (%g) must be "
                        "in [0, 1)", (double)d->beta1, (double)d->beta2);
    if (!(d->eps > 0.0f))
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc.eps (%g) must be > 0",
                        (double)d->eps);
    if (!d->ops || !d->ops->adamw)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc.ops: no op table with adamw");
    if (!mc_ops_same_memory(d->ops, d->ddp->desc.ops))
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc.ops ('%s') is not the memory of "
                        "the ddp's table ('%s'): the optimizer steps the ddp's grads (one memory "
                        "owner)", d->ops->name ? d->ops->name : "?",
                        d->ddp->desc.ops->name ? d->ddp->desc.ops->name : "?");
    if (d->params_dtype != MC_F32 && d->params_dtype != MC_BF16)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_desc.params_dtype (%d) must be MC_F32 "
                        "or MC_BF16", (int)d->params_dtype);
    return MC_OK;
}

/* The flat range [*lo, *hi) of param p whose grads this rank reduces and whose state it owns,
   and the state index of *lo. Empty (lo == hi) when the param lies outside the rank's shards. */
static void mc__opt_param_span(const mc_optimizer *opt, int p, size_t *lo, size_t *hi,
                               size_t *state_at) {
    const mc_ddp *ddp = opt->desc.ddp;
    const mc_param_info *info = &ddp->desc.table->info[p];
    size_t s0, s1;
    int b;
    *lo = info->offset;
    *hi = info->offset + info->numel;
    *state_at = *lo;
    if (!ddp->desc.distributed_optimizer) return;
    b = ddp->bucket_of[p];
    mc_ddp_shard(ddp, b, &s0, &s1);
    if (*lo < s0) *lo = s0;
    if (*hi > s1) *hi = s1;
    if (*hi < *lo) *hi = *lo;
    *state_at = ddp->desc.table->buckets[b].start / (size_t)ddp->dp_size + (*lo - s0);
}

/* The span tables, made once on the host and uploaded: the grad-norm spans (§12: not the tied
   copy, replicas counted on TP rank 0 only; registration order, neighbours merged) and the
   AdamW spans (every owned range, its weight decay). */
static int mc__opt_build_spans(mc_optimizer *opt) {
    const mc_param_table *t = opt->desc.ddp->desc.table;
    const mc_ops *o = opt->desc.ops;
    float weight_decay = opt->desc.weight_decay > 0.0f ? opt->desc.weight_decay : 0.0f;
    size_t *norm = (size_t *)mc_calloc(2 * (size_t)(t->count + 1), sizeof(size_t));
    mc_adamw_span *adam = (mc_adamw_span *)mc_calloc((size_t)(t->count + 1), sizeof *adam);
    size_t lo, hi, at;
    int i, nn = 0, na = 0, rc = MC_OK;
    if (!norm || !adam) rc = MC__FAIL(MC_ERR_NO_MEMORY, "mc_optimizer_init: out of memory");
    for (i = 0; rc == MC_OK && i < t->count; i++) {
        const mc_param_info *p = &t->info[i];
        mc__opt_param_span(opt, i, &lo, &hi, &at);
        if (hi == lo) continue;
        adam[na].grad_at = lo;
        adam[na].state_at = at;
        adam[na].main_at = opt->main ? at : lo;
        adam[na].n = hi - lo;
        adam[na].weight_decay = p->no_weight_decay ? 0.0f : weight_decay;
        na++;
        if (p->shared) continue;                                        /* the tied copy */
        if (!p->tensor_model_parallel && opt->tp_rank != 0) continue;   /* a TP replica */
        if (nn > 0 && norm[2 * nn - 1] == lo) {
            norm[2 * nn - 1] = hi;
        } else {
            norm[2 * nn] = lo;
            norm[2 * nn + 1] = hi;
            nn++;
        }
    }
    if (rc == MC_OK) {
        opt->norm_spans = (size_t *)mc__ops_alloc(o, MC_MEMORY_OPTIMIZER,
                                                  2 * (size_t)(nn + 1) * sizeof(size_t));
        opt->adamw_spans = (mc_adamw_span *)mc__ops_alloc(o, MC_MEMORY_OPTIMIZER,
                                                          (size_t)(na + 1) * sizeof *adam);
        opt->norm_sum = (double *)mc__ops_alloc(o, MC_MEMORY_OPTIMIZER, sizeof(double));
        if (!opt->norm_spans || !opt->adamw_spans || !opt->norm_sum)
            rc = MC__FAIL(MC_ERR_NO_MEMORY, "mc_optimizer_init: out of memory (%s)",
                          mc_last_error());
    }
    if (rc == MC_OK) rc = o->upload(o, opt->norm_spans, norm, 2 * (size_t)nn * sizeof(size_t));
    if (rc == MC_OK) rc = o->upload(o, opt->adamw_spans, adam, (size_t)na * sizeof *adam);
    opt->n_norm_spans = nn;
    opt->n_adamw_spans = na;
    mc_free(norm);
    mc_free(adam);
    return rc;
}

MC_API int mc_optimizer_init(mc_optimizer *opt, const mc_optimizer_desc *desc) {
    mc_optimizer o;
    const mc_ddp *ddp;
    const mc_ops *ops;
    int rc, i;
    if (!opt || !desc)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_optimizer_init: opt and desc must be set");
    memset(&o, 0, sizeof o);
    o.desc = *desc;
    mc__opt_defaults(&o.desc);
    if ((rc = mc__opt_validate(&o.desc)) != MC_OK) return rc;
    ddp = o.desc.ddp;
    ops = o.desc.ops;
    o.state_numel = ddp->desc.table->total /
                    (size_t)(ddp->desc.distributed_optimizer ? ddp->dp_size : 1);
    o.m = (float *)mc__ops_alloc(ops, MC_MEMORY_OPTIMIZER, o.state_numel * sizeof(float));
    o.v = (float *)mc__ops_alloc(ops, MC_MEMORY_OPTIMIZER, o.state_numel * sizeof(float));
    if (o.desc.params_dtype == MC_BF16)
        o.main = (float *)mc__ops_alloc(ops, MC_MEMORY_OPTIMIZER, o.state_numel * sizeof(float));
    if (!o.m || !o.v || (o.desc.params_dtype == MC_BF16 && !o.main)) {
        mc_optimizer_destroy(&o);
        return MC__FAIL(MC_ERR_NO_MEMORY, "mc_optimizer_init: out of memory (%d x %zu floats)",
                        o.desc.params_dtype == MC_BF16 ? 3 : 2, o.state_numel);
    }
    o.tp_rank = o.desc.ps ? mc_parallel_rank(o.desc.ps, MC_GROUP_TP) : 0;
    if (o.tp_rank < 0) o.tp_rank = 0;
    /* §12: grads are equal over DP without the distributed optimizer (reduce over TP x PP);
       with it each DP rank holds a disjoint shard (reduce over everyone). */
    if (ddp->desc.distributed_optimizer)
        o.stats = o.desc.ps ? o.desc.ps->world : ddp->desc.dp;
    else
        o.stats = o.desc.ps ? mc_parallel_group(o.desc.ps, MC_GROUP_MP) : NULL;
    o.last_clip_coeff = 1.0f;
    if (o.stats && !mc_ops_same_memory(mc_comm_memory(o.stats), ops)) {
        mc_optimizer_destroy(&o);
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_optimizer_init: the grad-norm communicator '%s' "
                        "works on other memory than the op table '%s' (one memory owner)",
                        o.stats->name, ops->name ? ops->name : "?");
    }
    rc = mc__opt_build_spans(&o);
    /* the fp32 main parameters start as the model's (bf16) values, range by range */
    for (i = 0; rc == MC_OK && o.main && i < ddp->desc.table->count; i++) {
        size_t lo, hi, at;
        mc__opt_param_span(&o, i, &lo, &hi, &at);
        if (hi > lo)
            rc = ops->copy(ops, o.main + at, (const char *)o.desc.params +
                                                 mc_dtype_bytes(MC_BF16, lo),
                           hi - lo, MC_F32, MC_BF16);
    }
    if (rc != MC_OK) {
        mc_optimizer_destroy(&o);
        return rc;
    }
    *opt = o;
    return MC_OK;
}

MC_API void mc_optimizer_destroy(mc_optimizer *opt) {
    const mc_ops *o;
    if (!opt) return;
    o = opt->desc.ops;
    if (o) {
        mc__ops_free(o, opt->m);
        mc__ops_free(o, opt->v);
        mc__ops_free(o, opt->main);
        mc__ops_free(o, opt->norm_spans);
        mc__ops_free(o, opt->adamw_spans);
        mc__ops_free(o, opt->norm_sum);
    }
    memset(opt, 0, sizeof *opt);
}

static int mc__opt_grad_norm(mc_optimizer *opt, double *norm);

MC_API int mc_optimizer_grad_norm(mc_optimizer *opt, double *norm) {
    long long span;
    int rc;
    if (!opt || !opt->m || !norm)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_optimizer_grad_norm: opt (initialised) and norm "
                        "must be set");
    span = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, "grad_norm", -1, -1, NULL, 0, 1) : -1;
    rc = mc__opt_grad_norm(opt, norm);
    if (span >= 0) mc__tl_close(span, rc, opt->desc.ops, NULL);
    return rc;
}

static int mc__opt_grad_norm(mc_optimizer *opt, double *norm) {
    const mc_ops *o = opt->desc.ops;
    double sum = 0.0;
    int rc;
    if ((rc = o->sum_squares(o, opt->norm_sum, opt->desc.ddp->desc.grads, opt->norm_spans,
                             opt->n_norm_spans)) != MC_OK)
        return rc;
    if (opt->stats &&
        (rc = mc_all_reduce(opt->stats, opt->norm_sum, opt->norm_sum, 1, MC_F64, MC_SUM)) != MC_OK)
        return rc;
    if ((rc = o->download(o, &sum, opt->norm_sum, sizeof sum)) != MC_OK) return rc;
    *norm = sqrt(sum);
    return MC_OK;
}

/* Scales every grad this rank steps (its shards under the distributed optimizer). */
static int mc__opt_scale_grads(mc_optimizer *opt, float coeff) {
    const mc_ddp *ddp = opt->desc.ddp;
    const mc_ops *o = opt->desc.ops;
    size_t s0, s1;
    int b, rc = MC_OK;
    for (b = 0; rc == MC_OK && b < ddp->desc.table->n_buckets; b++) {
        mc_ddp_shard(ddp, b, &s0, &s1);
        if (s1 > s0) rc = o->scale(o, ddp->desc.grads + s0, coeff, s1 - s0, MC_F32);
    }
    return rc;
}

/* Distributed optimizer: every DP rank gets every rank's freshly stepped shard. */
static int mc__opt_gather_params(mc_optimizer *opt) {
    const mc_ddp *ddp = opt->desc.ddp;
    mc_dtype dt = opt->desc.params_dtype;
    size_t s0 = 0, s1 = 0;
    int b, rc;
    if (!ddp->desc.distributed_optimizer || !ddp->desc.dp) return MC_OK;
    for (b = 0; b < ddp->desc.table->n_buckets; b++) {
        mc_ddp_shard(ddp, b, &s0, &s1);
        rc = mc_all_gather(ddp->desc.dp, (char *)opt->desc.params + mc_dtype_bytes(dt, s0),
                           (char *)opt->desc.params +
                               mc_dtype_bytes(dt, ddp->desc.table->buckets[b].start),
                           s1 - s0, dt);
        if (rc != MC_OK) return rc;
    }
    return MC_OK;
}

#if defined(MC_FAULT_HOOKS)
/* MC_FAULT_OPTIMIZER_SKIPS_PARAM: the matching params (and their fp32 main copies) are saved
   before the update (restore 0) and put back after it (restore 1). */
static int mc__opt_fault_keep(mc_optimizer *opt, int restore) {
    static void *saved[2];
    const mc_param_table *t = opt->desc.ddp->desc.table;
    const mc_ops *o = opt->desc.ops;
    mc_dtype dt = opt->desc.params_dtype;
    size_t bytes = mc_dtype_bytes(dt, t->total), main_bytes = opt->state_numel * sizeof(float);
    int i, rc = MC_OK;
    if (mc__fault.kind != MC_FAULT_OPTIMIZER_SKIPS_PARAM) return MC_OK;
    if (!restore) {   /* a copy of the whole buffers: simple, and this is a fault path */
        if (!(saved[0] = mc__ops_alloc(o, MC_MEMORY_PARAMETERS, bytes))) return MC_ERR_NO_MEMORY;
        rc = o->copy(o, saved[0], opt->desc.params, t->total, dt, dt);
        if (rc == MC_OK && opt->main) {
            if (!(saved[1] = mc__ops_alloc(o, MC_MEMORY_OPTIMIZER, main_bytes)))
                return MC_ERR_NO_MEMORY;
            rc = o->copy(o, saved[1], opt->main, opt->state_numel, MC_F32, MC_F32);
        }
        return rc;
    }
    for (i = 0; rc == MC_OK && i < t->count; i++) {
        const mc_param_info *p = &t->info[i];
        size_t lo, hi, at;
        if (!mc__fault_on_param(MC_FAULT_OPTIMIZER_SKIPS_PARAM, p->name)) continue;
        rc = o->copy(o, (char *)opt->desc.params + mc_dtype_bytes(dt, p->offset),
                     (char *)saved[0] + mc_dtype_bytes(dt, p->offset), p->numel, dt, dt);
        mc__opt_param_span(opt, i, &lo, &hi, &at);
        if (rc == MC_OK && opt->main && hi > lo)
            rc = o->copy(o, opt->main + at, (float *)saved[1] + at, hi - lo, MC_F32, MC_F32);
    }
    mc__ops_free(o, saved[0]);
    mc__ops_free(o, saved[1]);
    saved[0] = saved[1] = NULL;
    return rc;
}
#endif

/* A timeline span around one call of the step (-1 while nothing records). */
#define MC__OPT_SPAN(name, index, call, ops)                                                  \
    do {                                                                                     \
        long long sp_ = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, (name), (index), -1, NULL, 0, 1) \
                                  : -1;                                                      \
        rc = (call);                                                                         \
        if (sp_ >= 0) mc__tl_close(sp_, rc, (ops), NULL);                                    \
    } while (0)

static int mc__opt_step(mc_optimizer *opt);

MC_API int mc_optimizer_step(mc_optimizer *opt) {
    long long span;
    int rc;
    if (!opt || !opt->m)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_optimizer_step: opt is NULL or not initialised");
    span = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, "optimizer_step", -1, -1, NULL, 0, 1) : -1;
    rc = mc__opt_step(opt);
    if (span >= 0) mc__tl_close(span, rc, opt->desc.ops, NULL);
    return rc;
}

/* Megatron's order: grad norm (the non-finite check skips the step, as found_inf does),
   clipping, the update (fp32 main params, then the model's copy), the distributed optimizer's
   param all-gather, and the scheduler's step. */
static int mc__opt_step(mc_optimizer *opt) {
    const mc_optimizer_desc *d = &opt->desc;
    const mc_ops *o = d->ops;
    mc_adamw_step h;
    float lr, coeff = 1.0f;
    double norm = 0.0;
    int rc;
    lr = (float)mc_optimizer_lr_at(d, opt->lr_steps);
    if (d->clip_grad > 0.0f) {
        if ((rc = mc_optimizer_grad_norm(opt, &norm)) != MC_OK) return rc;
        if (!isfinite(norm))
            return MC__FAIL(MC_ERR_STATE, "mc_optimizer_step: grad norm is %g at iteration %lld; "
                            "the step is skipped", norm, opt->iteration + 1);
        coeff = (float)(d->clip_grad / (norm + MC__OPT_CLIP_EPS));
        if (coeff >= 1.0f) coeff = 1.0f;
        MC__OPT_SPAN("clip_grads", coeff < 1.0f,
                     coeff < 1.0f ? mc__opt_scale_grads(opt, coeff) : MC_OK, o);
        if (rc != MC_OK) return rc;
    }
    h.lr = lr;
    h.beta1 = d->beta1;
    h.beta2 = d->beta2;
    h.eps = d->eps;
    h.step = (int)(opt->iteration + 1);
#if defined(MC_FAULT_HOOKS)
    if ((rc = mc__opt_fault_keep(opt, 0)) != MC_OK) return rc;
#endif
    MC__OPT_SPAN("adamw", -1,
                 o->adamw(o, opt->main ? opt->main : (float *)d->params, d->ddp->desc.grads,
                          opt->m, opt->v, opt->main ? d->params : NULL, opt->adamw_spans,
                          opt->n_adamw_spans, &h, d->params_dtype),
                 o);
#if defined(MC_FAULT_HOOKS)
    if (rc == MC_OK) rc = mc__opt_fault_keep(opt, 1);
#endif
    if (rc != MC_OK) return rc;
    if (d->ddp->desc.distributed_optimizer && d->ddp->desc.dp) {
        MC__OPT_SPAN("param_all_gather", -1, mc__opt_gather_params(opt), o);
        if (rc != MC_OK) return rc;
    }
    opt->iteration++;
    opt->lr_steps++;
    mc_timeline_mark("lr_scheduler_step", (int)opt->lr_steps);
    opt->last_lr = lr;
    opt->last_grad_norm = norm;
    opt->last_clip_coeff = coeff;
    return MC_OK;
}

static int mc__opt_check_param(const mc_optimizer *opt, int param, const char *fn) {
    if (!opt || !opt->m)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: opt is NULL or not initialised", fn);
    if (param < 0 || param >= opt->desc.ddp->desc.table->count)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: param (%d) must be in [0, %d)", fn, param,
                        opt->desc.ddp->desc.table->count);
    return MC_OK;
}

MC_API int mc_optimizer_owned_range(const mc_optimizer *opt, int param, size_t *lo, size_t *hi) {
    size_t a, b, at;
    int rc;
    if ((rc = mc__opt_check_param(opt, param, "mc_optimizer_owned_range")) != MC_OK) return rc;
    mc__opt_param_span(opt, param, &a, &b, &at);
    *lo = a - opt->desc.ddp->desc.table->info[param].offset;
    *hi = b - opt->desc.ddp->desc.table->info[param].offset;
    return MC_OK;
}

static float *mc__opt_state(mc_optimizer *opt, mc_optimizer_state_kind which) {
    return which == MC_OPTIM_EXP_AVG_SQ ? opt->v : opt->m;
}

MC_API int mc_optimizer_get_state(mc_optimizer *opt, int param, mc_optimizer_state_kind which,
                                  float *out) {
    const mc_ddp *ddp;
    const mc_ops *o;
    size_t lo, hi, at, numel, first;
    int rc;
    if ((rc = mc__opt_check_param(opt, param, "mc_optimizer_get_state")) != MC_OK) return rc;
    ddp = opt->desc.ddp;
    o = opt->desc.ops;
    numel = ddp->desc.table->info[param].numel;
    mc__opt_param_span(opt, param, &lo, &hi, &at);
    first = lo - ddp->desc.table->info[param].offset;
    if (!ddp->desc.distributed_optimizer || !ddp->desc.dp)
        return o->copy(o, out, mc__opt_state(opt, which) + at, numel, MC_F32, MC_F32);
    /* The owners' pieces are disjoint and cover the param: summing zero-filled copies over
       DP assembles it exactly (x + 0 = x). */
    if ((rc = o->fill(o, out, 0.0f, numel, MC_F32)) != MC_OK) return rc;
    if (hi > lo &&
        (rc = o->copy(o, out + first, mc__opt_state(opt, which) + at, hi - lo, MC_F32, MC_F32)) !=
            MC_OK)
        return rc;
    return mc_all_reduce(ddp->desc.dp, out, out, numel, MC_F32, MC_SUM);
}

MC_API int mc_optimizer_set_state(mc_optimizer *opt, int param, mc_optimizer_state_kind which,
                                  const float *in) {
    const mc_ops *o;
    size_t lo, hi, at;
    int rc;
    if ((rc = mc__opt_check_param(opt, param, "mc_optimizer_set_state")) != MC_OK) return rc;
    o = opt->desc.ops;
    mc__opt_param_span(opt, param, &lo, &hi, &at);
    if (hi > lo)
        return o->copy(o, mc__opt_state(opt, which) + at,
                       in + (lo - opt->desc.ddp->desc.table->info[param].offset), hi - lo, MC_F32,
                       MC_F32);
    return MC_OK;
}

/* @optimizer:implementation end */

/* @checkpoint:implementation begin */

// ---------------------------------------------------------------------------------------------
// >>dist_checkpointing  (see the declarations for the format)

#include <errno.h>
#include <stddef.h>   /* offsetof */
#if !defined(_WIN32)
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#endif


MC_API uint32_t mc_crc32(uint32_t crc, const void *data, size_t n) {
    /* Four bits at a time through a 16-entry table built here from the polynomial: fast enough
       for checkpoint files, no constant table to trust and no global state. */
    uint32_t table[16];
    const unsigned char *p = (const unsigned char *)data;
    uint32_t i;
    int bit;
    for (i = 0; i < 16; i++) {
        uint32_t c = i;
        for (bit = 0; bit < 4; bit++) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        table[i] = c;
    }
    crc = ~crc;
    while (n-- > 0) {
        crc ^= *p++;
        crc = (crc >> 4) ^ table[crc & 15u];
        crc = (crc >> 4) ^ table[crc & 15u];
    }
    return ~crc;
}

/* A growing text buffer (the metadata, the per-rank write reports). */
typedef struct mc__ckpt_sb {
    char *p;
    size_t len, cap;
    int oom;
} mc__ckpt_sb;

static void mc__ckpt_sb_printf(mc__ckpt_sb *sb, const char *fmt, ...) MC__PRINTF(2, 3);
static void mc__ckpt_sb_printf(mc__ckpt_sb *sb, const char *fmt, ...) {
    va_list ap;
    int n;
    if (sb->oom) return;
    va_start(ap, fmt);
    n = vsnprintf(sb->p ? sb->p + sb->len : NULL, sb->p ? sb->cap - sb->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        sb->oom = 1;
        return;
    }
    if (sb->len + (size_t)n + 1 > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 1024;
        char *q;
        while (cap < sb->len + (size_t)n + 1) cap *= 2;
        q = (char *)mc_malloc(cap);
        if (!q) {
            sb->oom = 1;
            return;
        }
        if (sb->len) memcpy(q, sb->p, sb->len);
        mc_free(sb->p);
        sb->p = q;
        sb->cap = cap;
        va_start(ap, fmt);
        vsnprintf(sb->p + sb->len, sb->cap - sb->len, fmt, ap);
        va_end(ap);
    }
    sb->len += (size_t)n;
}

static void mc__ckpt_sb_free(mc__ckpt_sb *sb) {
    mc_free(sb->p);
    memset(sb, 0, sizeof *sb);
}

/* ---- names, paths, numbers */

static const char *const mc__ckpt_kinds[3] = {"model", "exp_avg", "exp_avg_sq"};

static int mc__ckpt_kind_index(const char *kind) {
    int k;
    for (k = 0; k < 3; k++)
        if (strcmp(kind, mc__ckpt_kinds[k]) == 0) return k;
    return -1;
}

/* Names become file names: letters, digits, '.', '_' and '-', not starting with '.', so that
   neither a parameter name nor a crafted metadata file can point outside the directory. */
static int mc__ckpt_name_ok(const char *s) {
    if (!s || !s[0] || s[0] == '.') return 0;
    for (; *s; s++) {
        char c = *s;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok) return 0;
    }
    return 1;
}

static int mc__ckpt_join(char *out, const char *dir, const char *name) {
    int n = snprintf(out, MC_CKPT_PATH_MAX, "%s/%s", dir, name);
    if (n < 0 || n >= MC_CKPT_PATH_MAX)
        return MC__FAIL(MC_ERR_INVALID_ARG, "checkpoint path \"%s/%s\" is longer than %d bytes",
                        dir, name, MC_CKPT_PATH_MAX - 1);
    return MC_OK;
}

MC_API int mc_checkpoint_iteration_dir(char *out, size_t cap, const char *dir,
                                       long long iteration) {
    int n;
    if (!out || !dir || cap == 0)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_checkpoint_iteration_dir: out and dir must be set");
    if (iteration == MC_CKPT_RELEASE)
        n = snprintf(out, cap, "%s/release", dir);
    else if (iteration < 0)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_checkpoint_iteration_dir: iteration (%lld) must be >= 0 or "
                        "MC_CKPT_RELEASE", iteration);
    else
        n = snprintf(out, cap, "%s/iter_%07lld", dir, iteration);
    if (n < 0 || (size_t)n >= cap)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "mc_checkpoint_iteration_dir: the path for \"%s\" does not fit in %zu bytes",
                        dir, cap);
    return MC_OK;
}

/* Whole-token integer parsing: "12x" and "" are errors, not 12 and 0. */
static int mc__ckpt_parse_ll(const char *s, long long *out) {
    char *end = NULL;
    long long v;
    if (!s || !*s) return 0;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || !end || *end != '\0') return 0;
    *out = v;
    return 1;
}

static int mc__ckpt_parse_hex(const char *s, int digits, uint64_t *out) {
    uint64_t v = 0;
    int i;
    if (!s || (int)strlen(s) != digits) return 0;
    for (i = 0; i < digits; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                         : -1;
        if (d < 0) return 0;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return 1;
}

static int mc__ckpt_host_big_endian(void) {
    const uint32_t probe = 0x01020304u;
    unsigned char b[4];
    memcpy(b, &probe, 4);
    return b[0] == 0x01;
}

/* The padded vocabulary of cfg at TP size tp, or -1 (checked first, so that no error is
   recorded for a config without a vocabulary). */
static long long mc__ckpt_padded_vocab(const mc_gpt_config *cfg, int tp) {
    int div = MC__DEF(cfg->make_vocab_size_divisible_by, 128), padded;
    if (cfg->vocab_size <= 0 || div <= 0 || tp <= 0) return -1;
    padded = mc_gpt_padded_vocab_size(cfg->vocab_size, div, tp);
    return padded > 0 ? padded : -1;
}

/* ---- the config as text: every mc_gpt_config field, by name */

typedef enum { MC__CKPT_INT, MC__CKPT_FLOAT, MC__CKPT_GRANULARITY, MC__CKPT_METHOD } mc__ckpt_ftype;

typedef struct mc__ckpt_field {
    const char *name;
    mc__ckpt_ftype type;
    size_t offset;
} mc__ckpt_field;

#define MC__CKPT_F(name, type) {#name, type, offsetof(mc_gpt_config, name)}
static const mc__ckpt_field mc__ckpt_config_fields[] = {
    MC__CKPT_F(num_layers, MC__CKPT_INT),
    MC__CKPT_F(hidden_size, MC__CKPT_INT),
    MC__CKPT_F(num_attention_heads, MC__CKPT_INT),
    MC__CKPT_F(ffn_hidden_size, MC__CKPT_INT),
    MC__CKPT_F(kv_channels, MC__CKPT_INT),
    MC__CKPT_F(num_query_groups, MC__CKPT_INT),
    MC__CKPT_F(vocab_size, MC__CKPT_INT),
    MC__CKPT_F(make_vocab_size_divisible_by, MC__CKPT_INT),
    MC__CKPT_F(max_position_embeddings, MC__CKPT_INT),
    MC__CKPT_F(seq_length, MC__CKPT_INT),
    MC__CKPT_F(layernorm_epsilon, MC__CKPT_FLOAT),
    MC__CKPT_F(init_method_std, MC__CKPT_FLOAT),
    MC__CKPT_F(untie_embeddings_and_output_weights, MC__CKPT_INT),
    MC__CKPT_F(hidden_dropout, MC__CKPT_FLOAT),
    MC__CKPT_F(attention_dropout, MC__CKPT_FLOAT),
    MC__CKPT_F(tensor_model_parallel_size, MC__CKPT_INT),
    MC__CKPT_F(pipeline_model_parallel_size, MC__CKPT_INT),
    MC__CKPT_F(virtual_pipeline_model_parallel_size, MC__CKPT_INT),
    MC__CKPT_F(sequence_parallel, MC__CKPT_INT),
    MC__CKPT_F(recompute_granularity, MC__CKPT_GRANULARITY),
    MC__CKPT_F(recompute_method, MC__CKPT_METHOD),
    MC__CKPT_F(recompute_num_layers, MC__CKPT_INT),
    MC__CKPT_F(micro_batch_size, MC__CKPT_INT),
    MC__CKPT_F(seed, MC__CKPT_INT),
    MC__CKPT_F(padded_vocab_size, MC__CKPT_INT),
};
#undef MC__CKPT_F
#define MC__CKPT_N_CONFIG_FIELDS \
    ((int)(sizeof mc__ckpt_config_fields / sizeof mc__ckpt_config_fields[0]))

static void mc__ckpt_format_config(mc__ckpt_sb *sb, const mc_gpt_config *cfg) {
    int i;
    for (i = 0; i < MC__CKPT_N_CONFIG_FIELDS; i++) {
        const mc__ckpt_field *f = &mc__ckpt_config_fields[i];
        const char *at = (const char *)cfg + f->offset;
        if (f->type == MC__CKPT_FLOAT) {
            float v;
            memcpy(&v, at, sizeof v);
            mc__ckpt_sb_printf(sb, "config %s %.9g\n", f->name, (double)v);   /* exact for fp32 */
        } else if (f->type == MC__CKPT_GRANULARITY) {
            mc__ckpt_sb_printf(sb, "config %s %d\n", f->name, (int)cfg->recompute_granularity);
        } else if (f->type == MC__CKPT_METHOD) {
            mc__ckpt_sb_printf(sb, "config %s %d\n", f->name, (int)cfg->recompute_method);
        } else {
            int v;
            memcpy(&v, at, sizeof v);
            mc__ckpt_sb_printf(sb, "config %s %d\n", f->name, v);
        }
    }
}

/* 1 = set, 0 = unknown field (ignored), -1 = bad value. */
static int mc__ckpt_parse_config_field(mc_gpt_config *cfg, const char *name, const char *value) {
    int i;
    for (i = 0; i < MC__CKPT_N_CONFIG_FIELDS; i++) {
        const mc__ckpt_field *f = &mc__ckpt_config_fields[i];
        char *at = (char *)cfg + f->offset;
        if (strcmp(f->name, name) != 0) continue;
        if (f->type == MC__CKPT_FLOAT) {
            char *end = NULL;
            float v = strtof(value, &end);
            if (!end || end == value || *end != '\0') return -1;
            memcpy(at, &v, sizeof v);
        } else {
            long long v;
            if (!mc__ckpt_parse_ll(value, &v) || v < INT_MIN || v > INT_MAX) return -1;
            if (f->type == MC__CKPT_GRANULARITY)
                cfg->recompute_granularity = (mc_recompute_granularity)v;
            else if (f->type == MC__CKPT_METHOD)
                cfg->recompute_method = (mc_recompute_method)v;
            else {
                int iv = (int)v;
                memcpy(at, &iv, sizeof iv);
            }
        }
        return 1;
    }
    return 0;
}

/* ---- metadata: format and parse */

static int mc__ckpt_tensor_cmp(const void *a, const void *b) {
    const mc_checkpoint_tensor *x = (const mc_checkpoint_tensor *)a;
    const mc_checkpoint_tensor *y = (const mc_checkpoint_tensor *)b;
    int kx = mc__ckpt_kind_index(x->kind), ky = mc__ckpt_kind_index(y->kind);
    if (kx != ky) return kx < ky ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int mc__ckpt_rng_cmp(const void *a, const void *b) {
    const mc_checkpoint_rng_file *x = (const mc_checkpoint_rng_file *)a;
    const mc_checkpoint_rng_file *y = (const mc_checkpoint_rng_file *)b;
    if (x->pp != y->pp) return x->pp < y->pp ? -1 : 1;
    return x->tp < y->tp ? -1 : x->tp > y->tp;
}

MC_API void mc_checkpoint_meta_destroy(mc_checkpoint_meta *meta) {
    if (!meta) return;
    mc_free(meta->tensors);
    mc_free(meta->rng);
    meta->tensors = NULL;
    meta->rng = NULL;
    meta->n_tensors = meta->n_rng = 0;
}

MC_API const mc_checkpoint_tensor *mc_checkpoint_meta_find(const mc_checkpoint_meta *meta,
                                                           const char *kind, const char *name) {
    mc_checkpoint_tensor key;
    if (!meta || !kind || !name || meta->n_tensors == 0) return NULL;
    if (strlen(kind) >= sizeof key.kind || strlen(name) >= sizeof key.name) return NULL;
    memset(&key, 0, sizeof key);
    strcpy(key.kind, kind);
    strcpy(key.name, name);
    return (const mc_checkpoint_tensor *)bsearch(&key, meta->tensors, (size_t)meta->n_tensors,
                                                 sizeof key, mc__ckpt_tensor_cmp);
}

static long long mc__ckpt_numel(const mc_checkpoint_tensor *t) { return t->shape[0] * t->shape[1]; }

/* "[64, 16]" or "[16]", for messages. */
static const char *mc__ckpt_shape_str(char *buf, size_t cap, int ndim, long long d0, long long d1) {
    if (ndim == 2)
        snprintf(buf, cap, "[%lld, %lld]", d0, d1);
    else
        snprintf(buf, cap, "[%lld]", d0);
    return buf;
}

/* Writes the whole metadata text, ending with the "end <crc32>" line. */
static void mc__ckpt_format_metadata(mc__ckpt_sb *sb, const mc_checkpoint_meta *m) {
    int i;
    uint32_t crc;
    mc__ckpt_sb_printf(sb, "megatron_c-checkpoint %d\n", MC_CKPT_FORMAT_VERSION);
    mc__ckpt_sb_printf(sb, "byte_order %s\n", m->big_endian ? "big" : "little");
    mc__ckpt_sb_printf(sb, "iteration %lld\n", m->iteration);
    mc__ckpt_sb_printf(sb, "consumed_samples %lld\n", m->consumed_samples);
    mc__ckpt_sb_printf(sb, "optimizer_step %lld\n", m->optimizer_step);
    mc__ckpt_sb_printf(sb, "math_fingerprint %016llx\n", (unsigned long long)m->math_fingerprint);
    mc__ckpt_sb_printf(sb, "layout_fingerprint %016llx\n", (unsigned long long)m->layout_fingerprint);
    mc__ckpt_sb_printf(sb, "layout tp %d pp %d dp %d cp %d vpp %d world %d\n", m->tp, m->pp, m->dp,
                  m->cp, m->vpp, m->world);
    mc__ckpt_format_config(sb, &m->config);
    for (i = 0; i < m->n_tensors; i++) {
        const mc_checkpoint_tensor *t = &m->tensors[i];
        mc__ckpt_sb_printf(sb, "tensor %s %s f32 %d %lld", t->kind, t->name, t->ndim, t->shape[0]);
        if (t->ndim == 2) mc__ckpt_sb_printf(sb, " %lld", t->shape[1]);
        mc__ckpt_sb_printf(sb, " %s %lld %08lx\n", t->file, t->bytes, (unsigned long)t->crc32);
    }
    for (i = 0; i < m->n_rng; i++) {
        const mc_checkpoint_rng_file *r = &m->rng[i];
        mc__ckpt_sb_printf(sb, "rng %d %d %s %lld %08lx\n", r->pp, r->tp, r->file, r->bytes,
                      (unsigned long)r->crc32);
    }
    crc = sb->oom ? 0 : mc_crc32(0, sb->p, sb->len);
    mc__ckpt_sb_printf(sb, "end %08lx\n", (unsigned long)crc);
}

#define MC__CKPT_MAX_TOKENS 16

/* Splits a line (modified in place) at single spaces. Returns the token count, or -1 for more
   than MC__CKPT_MAX_TOKENS tokens or an empty token (two spaces, a leading or trailing one). */
static int mc__ckpt_split(char *line, char **tok) {
    int n = 0;
    char *p = line;
    if (*p == '\0') return 0;
    for (;;) {
        char *sp = strchr(p, ' ');
        if (n == MC__CKPT_MAX_TOKENS) return -1;
        tok[n++] = p;
        if (!sp) break;
        *sp = '\0';
        if (*p == '\0') return -1;
        p = sp + 1;
        if (*p == '\0') return -1;
    }
    return tok[n - 1][0] ? n : -1;
}

typedef struct mc__ckpt_parse {
    const char *src;
    int line;
    int cap_tensors, cap_rng;
} mc__ckpt_parse;

#define MC__CKPT_BAD(ps_, ...) mc__ckpt_bad_line((ps_), __LINE__, __VA_ARGS__)
static int mc__ckpt_bad_line(const mc__ckpt_parse *ps, int src_line, const char *fmt, ...)
    MC__PRINTF(3, 4);
static int mc__ckpt_bad_line(const mc__ckpt_parse *ps, int src_line, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mc__fail_at(MC_ERR_IO, (uint32_t)src_line, __FILE__, "%s line %d: %s", ps->src,
                       ps->line, what);
}

/* Returns arr with room for `need` elements (a bigger copy when needed, the old one freed), or
   NULL when out of memory (arr is then still valid). */
static void *mc__ckpt_grow(void *arr, int *cap, int need, size_t elem) {
    void *q;
    int cap2;
    if (need <= *cap) return arr;
    cap2 = *cap ? *cap * 2 : 64;
    while (cap2 < need) cap2 *= 2;
    q = mc_malloc((size_t)cap2 * elem);
    if (!q) return NULL;
    if (arr) memcpy(q, arr, (size_t)*cap * elem);
    mc_free(arr);
    *cap = cap2;
    return q;
}

static int mc__ckpt_parse_tensor(mc_checkpoint_meta *m, mc__ckpt_parse *ps, char **tok, int n) {
    mc_checkpoint_tensor t;
    long long v, numel;
    uint64_t crc;
    void *grown;
    int i, at;
    memset(&t, 0, sizeof t);
    if (n != 9 && n != 10)
        return MC__CKPT_BAD(ps, "a tensor line has 9 or 10 fields "
                                "(tensor KIND NAME f32 NDIM D0 [D1] FILE BYTES CRC32), found %d", n);
    if (mc__ckpt_kind_index(tok[1]) < 0)
        return MC__CKPT_BAD(ps, "tensor kind \"%s\" is not model, exp_avg or exp_avg_sq", tok[1]);
    if (!mc__ckpt_name_ok(tok[2]) || strlen(tok[2]) >= sizeof t.name)
        return MC__CKPT_BAD(ps, "tensor name \"%s\" is not a valid parameter name", tok[2]);
    if (strcmp(tok[3], "f32") != 0)
        return MC__CKPT_BAD(ps, "tensor %s: dtype \"%s\" is not supported (only f32)", tok[2],
                            tok[3]);
    if (!mc__ckpt_parse_ll(tok[4], &v) || v != n - 8)
        return MC__CKPT_BAD(ps, "tensor %s: ndim \"%s\" does not match its %d dimension field(s)",
                            tok[2], tok[4], n - 8);
    strcpy(t.kind, tok[1]);
    strcpy(t.name, tok[2]);
    t.ndim = (int)v;
    t.shape[1] = 1;
    for (i = 0; i < t.ndim; i++)
        if (!mc__ckpt_parse_ll(tok[5 + i], &t.shape[i]) || t.shape[i] <= 0 ||
            t.shape[i] > INT_MAX)
            return MC__CKPT_BAD(ps, "tensor %s: dimension %d (\"%s\") must be in [1, %d]", t.name,
                                i, tok[5 + i], INT_MAX);
    at = 5 + t.ndim;
    if (!mc__ckpt_name_ok(tok[at]) || strlen(tok[at]) >= sizeof t.file)
        return MC__CKPT_BAD(ps, "tensor %s: file name \"%s\" is not a plain file name", t.name,
                            tok[at]);
    strcpy(t.file, tok[at]);
    numel = t.shape[0] * t.shape[1];
    if (!mc__ckpt_parse_ll(tok[at + 1], &t.bytes) || t.bytes != MC_CKPT_HEADER_BYTES + 4 * numel)
        return MC__CKPT_BAD(ps, "tensor %s: %s bytes, but %d header bytes + %lld f32 elements "
                                "make %lld", t.name, tok[at + 1], MC_CKPT_HEADER_BYTES, numel,
                            MC_CKPT_HEADER_BYTES + 4 * numel);
    if (!mc__ckpt_parse_hex(tok[at + 2], 8, &crc))
        return MC__CKPT_BAD(ps, "tensor %s: checksum \"%s\" is not 8 hex digits", t.name,
                            tok[at + 2]);
    t.crc32 = (uint32_t)crc;
    grown = mc__ckpt_grow(m->tensors, &ps->cap_tensors, m->n_tensors + 1, sizeof t);
    if (!grown) return MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", ps->src);
    m->tensors = (mc_checkpoint_tensor *)grown;
    m->tensors[m->n_tensors++] = t;
    return MC_OK;
}

static int mc__ckpt_parse_rng(mc_checkpoint_meta *m, mc__ckpt_parse *ps, char **tok, int n) {
    mc_checkpoint_rng_file r;
    long long pp, tp;
    uint64_t crc;
    void *grown;
    memset(&r, 0, sizeof r);
    if (n != 6)
        return MC__CKPT_BAD(ps, "an rng line has 6 fields (rng PP TP FILE BYTES CRC32), found %d",
                            n);
    if (!mc__ckpt_parse_ll(tok[1], &pp) || !mc__ckpt_parse_ll(tok[2], &tp) || pp < 0 || tp < 0 ||
        pp > INT_MAX || tp > INT_MAX)
        return MC__CKPT_BAD(ps, "rng position \"%s %s\" is not two ranks >= 0", tok[1], tok[2]);
    if (!mc__ckpt_name_ok(tok[3]) || strlen(tok[3]) >= sizeof r.file)
        return MC__CKPT_BAD(ps, "rng file name \"%s\" is not a plain file name", tok[3]);
    if (!mc__ckpt_parse_ll(tok[4], &r.bytes) || r.bytes < 0)
        return MC__CKPT_BAD(ps, "rng file %s: size \"%s\" is not a byte count", tok[3], tok[4]);
    if (!mc__ckpt_parse_hex(tok[5], 8, &crc))
        return MC__CKPT_BAD(ps, "rng file %s: checksum \"%s\" is not 8 hex digits", tok[3],
                            tok[5]);
    r.pp = (int)pp;
    r.tp = (int)tp;
    strcpy(r.file, tok[3]);
    r.crc32 = (uint32_t)crc;
    grown = mc__ckpt_grow(m->rng, &ps->cap_rng, m->n_rng + 1, sizeof r);
    if (!grown) return MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", ps->src);
    m->rng = (mc_checkpoint_rng_file *)grown;
    m->rng[m->n_rng++] = r;
    return MC_OK;
}

static int mc__ckpt_parse_layout(mc_checkpoint_meta *m, mc__ckpt_parse *ps, char **tok, int n) {
    static const char *const keys[6] = {"tp", "pp", "dp", "cp", "vpp", "world"};
    int *dst[6];
    int i, k, seen = 0;
    dst[0] = &m->tp;
    dst[1] = &m->pp;
    dst[2] = &m->dp;
    dst[3] = &m->cp;
    dst[4] = &m->vpp;
    dst[5] = &m->world;
    if (n % 2 != 1) return MC__CKPT_BAD(ps, "layout needs KEY VALUE pairs");
    for (i = 1; i + 1 < n; i += 2) {
        long long v;
        for (k = 0; k < 6 && strcmp(tok[i], keys[k]) != 0; k++) {}
        if (k == 6) continue;   /* an axis this build does not know */
        if (!mc__ckpt_parse_ll(tok[i + 1], &v) || v < 0 || v > INT_MAX ||
            (v == 0 && k != 4))
            return MC__CKPT_BAD(ps, "layout %s \"%s\" is not a valid size", tok[i], tok[i + 1]);
        *dst[k] = (int)v;
        seen |= 1 << k;
    }
    for (k = 0; k < 6; k++)
        if (k != 4 && !(seen & (1 << k)))
            return MC__CKPT_BAD(ps, "layout has no %s", keys[k]);
    if ((long long)m->tp * m->pp * m->dp * m->cp != m->world)
        return MC__CKPT_BAD(ps, "layout tp %d x pp %d x dp %d x cp %d is not world %d", m->tp,
                            m->pp, m->dp, m->cp, m->world);
    return MC_OK;
}

/* Checks the magic line, the version and the end line's checksum, so that a foreign,
   truncated or corrupted file is named as such before its lines are interpreted. On success
   *body_end is the offset of the end line. */
static int mc__ckpt_check_envelope(const char *text, size_t len, const char *src,
                                   size_t *body_end) {
    size_t first_end = 0, last_start, end_len;
    long long version;
    uint64_t stored;
    uint32_t crc;
    char head[64], tail[64];
    while (first_end < len && text[first_end] != '\n') first_end++;
    {
        size_t n = first_end < sizeof head - 1 ? first_end : sizeof head - 1;
        memcpy(head, text, n);
        head[n] = '\0';
    }
    if (strncmp(head, "megatron_c-checkpoint ", 22) != 0)
        return MC__FAIL(MC_ERR_IO,
                        "%s line 1: expected \"megatron_c-checkpoint <version>\", found \"%s\" "
                        "(not a megatron_c checkpoint metadata file)", src, head);
    if (!mc__ckpt_parse_ll(head + 22, &version))
        return MC__FAIL(MC_ERR_IO, "%s line 1: version \"%s\" is not a number", src, head + 22);
    if (version != MC_CKPT_FORMAT_VERSION)
        return MC__FAIL(MC_ERR_IO,
                        "%s: checkpoint format version %lld, this build reads version %d", src,
                        version, MC_CKPT_FORMAT_VERSION);
    /* The end line is the last line; the file ends with its newline. */
    if (len == 0 || text[len - 1] != '\n')
        return MC__FAIL(MC_ERR_IO,
                        "%s is truncated: it does not end with a complete \"end <crc32>\" line "
                        "(%zu bytes)", src, len);
    last_start = len - 1;
    while (last_start > 0 && text[last_start - 1] != '\n') last_start--;
    end_len = len - 1 - last_start;
    if (end_len != 12 || strncmp(text + last_start, "end ", 4) != 0) {
        size_t n = end_len < sizeof tail - 1 ? end_len : sizeof tail - 1;
        memcpy(tail, text + last_start, n);
        tail[n] = '\0';
        return MC__FAIL(MC_ERR_IO,
                        "%s is truncated: the last line is \"%s\", not \"end <crc32>\" "
                        "(%zu bytes)", src, tail, len);
    }
    memcpy(tail, text + last_start + 4, 8);
    tail[8] = '\0';
    if (!mc__ckpt_parse_hex(tail, 8, &stored))
        return MC__FAIL(MC_ERR_IO, "%s: the end line's checksum \"%s\" is not 8 hex digits", src,
                        tail);
    crc = mc_crc32(0, text, last_start);
    if (crc != (uint32_t)stored)
        return MC__FAIL(MC_ERR_IO,
                        "%s is corrupted: its content has CRC32 %08lx, the end line says %08lx",
                        src, (unsigned long)crc, (unsigned long)stored);
    *body_end = last_start;
    return MC_OK;
}

MC_API int mc_checkpoint_parse_metadata(mc_checkpoint_meta *meta, const char *text, size_t len,
                                        const char *source, const mc_gpt_config *base) {
    mc__ckpt_parse ps;
    char *buf = NULL, *line, *tok[MC__CKPT_MAX_TOKENS];
    size_t body_end = 0, i;
    int rc, n, have = 0;   /* bits: 1 iteration, 2 math, 4 layout fp, 8 layout, 16 byte order */
    if (!meta) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_checkpoint_parse_metadata: meta is NULL");
    memset(meta, 0, sizeof *meta);
    if (base) meta->config = *base;
    memset(&ps, 0, sizeof ps);
    ps.src = source ? source : "metadata";
    if (!text) return MC__FAIL(MC_ERR_INVALID_ARG, "mc_checkpoint_parse_metadata: text is NULL");
    for (i = 0; i < len; i++)
        if (text[i] == '\0')
            return MC__FAIL(MC_ERR_IO, "%s: byte %zu is NUL (not a text file)", ps.src, i);
    rc = mc__ckpt_check_envelope(text, len, ps.src, &body_end);
    if (rc != MC_OK) return rc;
    buf = (char *)mc_malloc(body_end + 1);
    if (!buf) return MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", ps.src);
    memcpy(buf, text, body_end);
    buf[body_end] = '\0';
    line = strchr(buf, '\n') + 1;   /* the magic line was checked */
    ps.line = 1;
    while (*line) {
        char *nl = strchr(line, '\n');
        long long v;
        uint64_t h;
        ps.line++;
        if (nl) *nl = '\0';
        n = mc__ckpt_split(line, tok);
        if (n < 0) {
            rc = MC__CKPT_BAD(&ps, "malformed line (fields are separated by one space)");
            goto done;
        }
        if (n == 0) {
            rc = MC__CKPT_BAD(&ps, "empty line");
            goto done;
        }
        if (strcmp(tok[0], "tensor") == 0) {
            rc = mc__ckpt_parse_tensor(meta, &ps, tok, n);
        } else if (strcmp(tok[0], "rng") == 0) {
            rc = mc__ckpt_parse_rng(meta, &ps, tok, n);
        } else if (strcmp(tok[0], "layout") == 0) {
            rc = mc__ckpt_parse_layout(meta, &ps, tok, n);
            have |= 8;
        } else if (strcmp(tok[0], "config") == 0) {
            if (n != 3 || mc__ckpt_parse_config_field(&meta->config, tok[1], tok[2]) < 0)
                rc = MC__CKPT_BAD(&ps, "a config line is \"config FIELD VALUE\" with a number");
        } else if (strcmp(tok[0], "byte_order") == 0) {
            if (n != 2 || (strcmp(tok[1], "little") != 0 && strcmp(tok[1], "big") != 0))
                rc = MC__CKPT_BAD(&ps, "byte_order must be \"little\" or \"big\"");
            else
                meta->big_endian = strcmp(tok[1], "big") == 0;
            have |= 16;
        } else if (strcmp(tok[0], "iteration") == 0 || strcmp(tok[0], "consumed_samples") == 0 ||
                   strcmp(tok[0], "optimizer_step") == 0) {
            if (n != 2 || !mc__ckpt_parse_ll(tok[1], &v) ||
                (v < 0 && !(v == MC_CKPT_RELEASE && tok[0][0] == 'i')))
                rc = MC__CKPT_BAD(&ps, "%s must be one integer >= 0", tok[0]);
            else if (tok[0][0] == 'i') {
                meta->iteration = v;
                have |= 1;
            } else if (tok[0][0] == 'c')
                meta->consumed_samples = v;
            else
                meta->optimizer_step = v;
        } else if (strcmp(tok[0], "math_fingerprint") == 0 ||
                   strcmp(tok[0], "layout_fingerprint") == 0) {
            if (n != 2 || !mc__ckpt_parse_hex(tok[1], 16, &h))
                rc = MC__CKPT_BAD(&ps, "%s must be 16 hex digits", tok[0]);
            else if (tok[0][0] == 'm') {
                meta->math_fingerprint = h;
                have |= 2;
            } else {
                meta->layout_fingerprint = h;
                have |= 4;
            }
        }   /* other keys: written by a newer version, ignored */
        if (rc != MC_OK) goto done;
        if (!nl) break;
        line = nl + 1;
    }
    {
        static const char *const names[5] = {"iteration", "math_fingerprint",
                                             "layout_fingerprint", "layout", "byte_order"};
        int k;
        for (k = 0; k < 5; k++)
            if (!(have & (1 << k))) {
                rc = MC__FAIL(MC_ERR_IO, "%s: no \"%s\" line", ps.src, names[k]);
                goto done;
            }
    }
    meta->format_version = MC_CKPT_FORMAT_VERSION;
    if (meta->n_tensors > 1)
        qsort(meta->tensors, (size_t)meta->n_tensors, sizeof *meta->tensors, mc__ckpt_tensor_cmp);
    if (meta->n_rng > 1) qsort(meta->rng, (size_t)meta->n_rng, sizeof *meta->rng, mc__ckpt_rng_cmp);
    for (n = 1; n < meta->n_tensors; n++)
        if (mc__ckpt_tensor_cmp(&meta->tensors[n - 1], &meta->tensors[n]) == 0) {
            rc = MC__FAIL(MC_ERR_IO, "%s: tensor %s %s is listed twice", ps.src,
                          meta->tensors[n].kind, meta->tensors[n].name);
            goto done;
        }
    for (n = 1; n < meta->n_rng; n++)
        if (mc__ckpt_rng_cmp(&meta->rng[n - 1], &meta->rng[n]) == 0) {
            rc = MC__FAIL(MC_ERR_IO, "%s: rng state of pp %d tp %d is listed twice", ps.src,
                          meta->rng[n].pp, meta->rng[n].tp);
            goto done;
        }
done:
    mc_free(buf);
    return rc;
}

MC_API int mc_checkpoint_latest(const char *dir, long long *iteration) {
    char path[MC_CKPT_PATH_MAX], buf[64];
    FILE *f;
    size_t n;
    long long v;
    int rc;
    if (!dir || !iteration)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_checkpoint_latest: dir and iteration must be set");
    rc = mc__ckpt_join(path, dir, MC_CKPT_LATEST_FILE);
    if (rc != MC_OK) return rc;
    f = fopen(path, "rb");
    if (!f)
        return MC__FAIL(MC_ERR_IO, "no checkpoint in %s: cannot open %s: %s", dir, path,
                        strerror(errno));
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = '\0';
    if (strcmp(buf, "release") == 0) {
        *iteration = MC_CKPT_RELEASE;
        return MC_OK;
    }
    if (!mc__ckpt_parse_ll(buf, &v) || v < 0)
        return MC__FAIL(MC_ERR_IO, "%s holds \"%s\", not an iteration number or \"release\"", path,
                        buf);
    *iteration = v;
    return MC_OK;
}

#if !defined(_WIN32)

/* ---- POSIX file helpers. Positioned I/O is lseek + read/write on a descriptor this process
   owns: the same as pread/pwrite here, and declared even under strict -std=c99. */

static int mc__ckpt_os_fail(const char *what, const char *path) {
    return MC__FAIL(MC_ERR_IO, "checkpoint: %s %s: %s", what, path, strerror(errno));
}

static int mc__ckpt_write_at(int fd, const void *buf, size_t bytes, long long offset,
                             const char *path) {
    const char *p = (const char *)buf;
    if (lseek(fd, (off_t)offset, SEEK_SET) == (off_t)-1) return mc__ckpt_os_fail("cannot seek in", path);
    while (bytes > 0) {
        ssize_t n = write(fd, p, bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return mc__ckpt_os_fail("cannot write", path);
        p += n;
        bytes -= (size_t)n;
    }
    return MC_OK;
}

static int mc__ckpt_read_at(int fd, void *buf, size_t bytes, long long offset, const char *path) {
    char *p = (char *)buf;
    long long at = offset;
    if (lseek(fd, (off_t)offset, SEEK_SET) == (off_t)-1) return mc__ckpt_os_fail("cannot seek in", path);
    while (bytes > 0) {
        ssize_t n = read(fd, p, bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return mc__ckpt_os_fail("cannot read", path);
        if (n == 0)
            return MC__FAIL(MC_ERR_IO, "checkpoint file %s ends at byte %lld, %zu bytes short "
                                       "(the file is truncated)", path, at, bytes);
        p += n;
        at += n;
        bytes -= (size_t)n;
    }
    return MC_OK;
}

/* Creates or replaces `path` with data and fsyncs it. */
static int mc__ckpt_write_file(const char *path, const void *data, size_t len) {
    int rc, fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return mc__ckpt_os_fail("cannot create", path);
    rc = mc__ckpt_write_at(fd, data, len, 0, path);
    if (rc == MC_OK && fsync(fd) != 0) rc = mc__ckpt_os_fail("cannot fsync", path);
    if (close(fd) != 0 && rc == MC_OK) rc = mc__ckpt_os_fail("cannot close", path);
    return rc;
}

/* Reads a whole file (NUL-terminated; *out is freed with mc_free). */
static int mc__ckpt_read_file(const char *path, char **out, size_t *len, size_t limit) {
    struct stat st;
    int rc, fd = open(path, O_RDONLY);
    *out = NULL;
    *len = 0;
    if (fd < 0) return mc__ckpt_os_fail("cannot open", path);
    if (fstat(fd, &st) != 0) {
        rc = mc__ckpt_os_fail("cannot stat", path);
        close(fd);
        return rc;
    }
    if (st.st_size < 0 || (unsigned long long)st.st_size > limit) {
        close(fd);
        return MC__FAIL(MC_ERR_IO, "checkpoint file %s is %lld bytes, more than the %zu allowed",
                        path, (long long)st.st_size, limit);
    }
    *out = (char *)mc_malloc((size_t)st.st_size + 1);
    if (!*out) {
        close(fd);
        return MC__FAIL(MC_ERR_NO_MEMORY, "checkpoint: out of memory reading %s", path);
    }
    rc = mc__ckpt_read_at(fd, *out, (size_t)st.st_size, 0, path);
    close(fd);
    if (rc != MC_OK) {
        mc_free(*out);
        *out = NULL;
        return rc;
    }
    (*out)[st.st_size] = '\0';
    *len = (size_t)st.st_size;
    return MC_OK;
}

/* Makes a rename or a new file in `dir` durable. File systems that cannot fsync a directory
   say EINVAL; that is not an error. */
static int mc__ckpt_fsync_dir(const char *dir) {
    int rc = MC_OK, fd = open(dir, O_RDONLY);
    if (fd < 0) return mc__ckpt_os_fail("cannot open directory", dir);
    if (fsync(fd) != 0 && errno != EINVAL) rc = mc__ckpt_os_fail("cannot fsync directory", dir);
    close(fd);
    return rc;
}

static int mc__ckpt_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* mkdir -p */
static int mc__ckpt_mkdirs(const char *path) {
    char buf[MC_CKPT_PATH_MAX];
    size_t i, n = strlen(path);
    struct stat st;
    if (n >= sizeof buf)
        return MC__FAIL(MC_ERR_INVALID_ARG, "checkpoint directory \"%s\" is too long", path);
    memcpy(buf, path, n + 1);
    for (i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return mc__ckpt_os_fail("cannot create", buf);
        buf[i] = path[i];
    }
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return MC__FAIL(MC_ERR_IO, "checkpoint: %s exists and is not a directory", path);
    return MC_OK;
}

/* Removes a checkpoint directory: its files, then itself (checkpoints hold no subdirectories). */
static int mc__ckpt_remove_dir(const char *path) {
    char file[MC_CKPT_PATH_MAX];
    struct dirent *e;
    int rc = MC_OK;
    DIR *d = opendir(path);
    if (!d) return mc__ckpt_os_fail("cannot open directory", path);
    while (rc == MC_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        rc = mc__ckpt_join(file, path, e->d_name);
        if (rc == MC_OK && unlink(file) != 0) rc = mc__ckpt_os_fail("cannot remove", file);
    }
    closedir(d);
    if (rc == MC_OK && rmdir(path) != 0) rc = mc__ckpt_os_fail("cannot remove directory", path);
    return rc;
}

/* The 64-byte tensor file header (see >>dist_checkpointing). */
static void mc__ckpt_header(unsigned char *h, int ndim, long long d0, long long d1) {
    uint32_t u;
    uint64_t s;
    memset(h, 0, MC_CKPT_HEADER_BYTES);
    memcpy(h, "MCTENSOR", 8);
    u = MC_CKPT_FORMAT_VERSION;
    memcpy(h + 8, &u, 4);
    u = 0;   /* f32 */
    memcpy(h + 12, &u, 4);
    u = (uint32_t)ndim;
    memcpy(h + 16, &u, 4);
    u = 0x01020304u;
    memcpy(h + 20, &u, 4);
    s = (uint64_t)d0;
    memcpy(h + 24, &s, 8);
    s = (uint64_t)d1;
    memcpy(h + 32, &s, 8);
}

/* ---- the run context */

typedef struct mc__ckpt_ctx {
    const mc_checkpoint_desc *d;
    const char *fn;              /* "mc_checkpoint_save" / "mc_checkpoint_load" */
    mc_comm *world;
    int rank, size;
    int tp, tp_rank, pp, pp_rank, dp, cp, vpp;
    int main_replica;            /* dp = cp = 0: writes for its (tp, pp) position */
    int optim;                   /* exp_avg and exp_avg_sq given */
    float *data[3];              /* model, exp_avg, exp_avg_sq flat buffers */
} mc__ckpt_ctx;

static int mc__ckpt_begin(mc__ckpt_ctx *cx, const mc_checkpoint_desc *d, const char *fn) {
    const mc_parallel_state *ps;
    memset(cx, 0, sizeof *cx);
    if (!d || !d->ps || !d->ps->initialized || !d->ps->world)
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "%s: desc and desc->ps (an initialised mc_parallel_state with its world) "
                        "must be set", fn);
    ps = d->ps;
    cx->d = d;
    cx->fn = fn;
    cx->world = ps->world;
    cx->rank = ps->world->rank;
    cx->size = ps->world->size;
    cx->tp = ps->grid.desc.tp;
    cx->pp = ps->grid.desc.pp;
    cx->cp = ps->grid.desc.cp;
    cx->vpp = ps->grid.desc.vpp;
    cx->dp = ps->grid.dp;
    cx->tp_rank = ps->coords.tp;
    cx->pp_rank = ps->coords.pp;
    cx->main_replica = ps->coords.dp == 0 && ps->coords.cp == 0;
    cx->optim = d->exp_avg != NULL && d->exp_avg_sq != NULL;
    cx->data[0] = d->param_data;
    cx->data[1] = d->exp_avg;
    cx->data[2] = d->exp_avg_sq;
    return MC_OK;
}

/* Every rank learns whether any rank failed. The first failing rank's status and message
   become every rank's result, so all ranks return the same error and none is left waiting in a
   later collective for a rank that gave up. */
static int mc__ckpt_agree(mc_comm *world, int status) {
    int32_t key = status == MC_OK ? world->size : world->rank, first = 0, st = status;
    unsigned char msg[4 + MC__ERROR_LEN];
    char text[MC__ERROR_LEN];
    int rc = mc_host_collective(world, MC_COLL_ALL_REDUCE, &key, &first, 1, MC_I32, MC_MIN, 0);
    if (rc != MC_OK) return rc;
    if (first == world->size) return MC_OK;
    memset(msg, 0, sizeof msg);
    if (world->rank == first) {
        memcpy(msg, &st, 4);
        memcpy(msg + 4, mc__last_error_text, strlen(mc__last_error_text));
    }
    rc = mc_host_collective(world, MC_COLL_BROADCAST, msg, msg, sizeof msg, MC_U8, MC_SUM, first);
    if (rc != MC_OK) return rc;
    memcpy(&st, msg, 4);
    msg[sizeof msg - 1] = '\0';
    memcpy(text, msg + 4, sizeof text);
    if (strncmp(text, "rank ", 5) == 0) return MC__FAIL(st, "%s", text);   /* already agreed */
    return MC__FAIL(st, "rank %d: %s", (int)first, text);
}

#define MC__CKPT_AGREE(cx, rc)                      \
    do {                                            \
        (rc) = mc__ckpt_agree((cx)->world, (rc));   \
        if ((rc) != MC_OK) goto done;               \
    } while (0)

static int mc__ckpt_str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The parameter's shape checks for the layout of cx (the stride rule needs whole pieces). */
static int mc__ckpt_check_param(const mc__ckpt_ctx *cx, const mc_param_info *p) {
    const char *fn = cx->fn;
    int g[2], l[2], d, pd = p->partition_dim, stride = MC__DEF(p->partition_stride, 1);
    if (!mc__ckpt_name_ok(p->name))
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "%s: parameter \"%s\": a name holds only letters, digits, '.', '_' and '-' "
                        "and does not start with '.' (it names a file)", fn, p->name);
    if (p->ndim != 1 && p->ndim != 2)
        return MC__FAIL(MC_ERR_INVALID_DESC, "%s: parameter %s: ndim (%d) must be 1 or 2", fn,
                        p->name, p->ndim);
    g[0] = p->global_shape[0];
    l[0] = p->local_shape[0];
    g[1] = p->ndim == 2 ? p->global_shape[1] : 1;
    l[1] = p->ndim == 2 ? p->local_shape[1] : 1;
    if (g[0] < 1 || g[1] < 1 || l[0] < 1 || l[1] < 1)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "%s: parameter %s: shapes must be >= 1 (global [%d, %d], local [%d, %d])",
                        fn, p->name, g[0], g[1], l[0], l[1]);
    if ((size_t)l[0] * (size_t)l[1] != p->numel)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "%s: parameter %s: numel (%zu) is not local_shape %d x %d", fn, p->name,
                        p->numel, l[0], l[1]);
    if (cx->d->params->total > 0 && p->offset + p->numel > cx->d->params->total)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "%s: parameter %s: offset %zu + numel %zu is past the buffer's total %zu",
                        fn, p->name, p->offset, p->numel, cx->d->params->total);
    if (pd < 0) {
        if (g[0] != l[0] || g[1] != l[1])
            return MC__FAIL(MC_ERR_INVALID_DESC,
                            "%s: parameter %s is replicated (partition_dim -1) but its local shape "
                            "[%d, %d] is not its global shape [%d, %d]", fn, p->name, l[0], l[1],
                            g[0], g[1]);
        return MC_OK;
    }
    if (pd >= p->ndim)
        return MC__FAIL(MC_ERR_INVALID_DESC, "%s: parameter %s: partition_dim (%d) must be < ndim (%d)",
                        fn, p->name, pd, p->ndim);
    if (stride < 1)
        return MC__FAIL(MC_ERR_INVALID_DESC, "%s: parameter %s: partition_stride (%d) must be >= 1",
                        fn, p->name, stride);
    if ((long long)l[pd] * cx->tp != g[pd])
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "%s: parameter %s: global_shape[%d] (%d) must be local_shape[%d] (%d) x "
                        "tensor_model_parallel_size (%d)", fn, p->name, pd, g[pd], pd, l[pd], cx->tp);
    if (l[pd] % stride != 0)
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "%s: parameter %s: local_shape[%d] (%d) must be a multiple of "
                        "partition_stride (%d)", fn, p->name, pd, l[pd], stride);
    d = 1 - pd;
    if (p->ndim == 2 && g[d] != l[d])
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "%s: parameter %s: dimension %d is not split, yet global_shape[%d] (%d) != "
                        "local_shape[%d] (%d)", fn, p->name, d, d, g[d], d, l[d]);
    return MC_OK;
}

/* Local checks of the desc and the table, before anything touches the disk. */
static int mc__ckpt_validate(const mc__ckpt_ctx *cx) {
    const mc_checkpoint_desc *d = cx->d;
    const mc_param_table *t = d->params;
    const char **names;
    int i, rc = MC_OK;
    if (!d->dir || !d->dir[0]) return MC__FAIL(MC_ERR_INVALID_ARG, "%s: desc->dir must be set", cx->fn);
    if (strlen(d->dir) + 2 * MC_CKPT_FILE_MAX + 32 >= MC_CKPT_PATH_MAX)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: desc->dir \"%s\" is too long (%zu bytes)", cx->fn,
                        d->dir, strlen(d->dir));
    if (!d->config) return MC__FAIL(MC_ERR_INVALID_ARG, "%s: desc->config must be set", cx->fn);
    if (!t || t->count < 0 || (t->count > 0 && !t->info))
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: desc->params must be a parameter table", cx->fn);
    if (t->count > 0 && !d->param_data)
        return MC__FAIL(MC_ERR_INVALID_ARG, "%s: desc->param_data must be set", cx->fn);
    if ((d->exp_avg == NULL) != (d->exp_avg_sq == NULL))
        return MC__FAIL(MC_ERR_INVALID_ARG,
                        "%s: desc->exp_avg (%p) and desc->exp_avg_sq (%p) are given together or "
                        "not at all", cx->fn, (void *)d->exp_avg, (void *)d->exp_avg_sq);
    for (i = 0; i < t->count; i++) {
        rc = mc__ckpt_check_param(cx, &t->info[i]);
        if (rc != MC_OK) return rc;
    }
    if (t->count < 2) return MC_OK;
    names = (const char **)mc_malloc((size_t)t->count * sizeof *names);
    if (!names) return MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", cx->fn);
    for (i = 0; i < t->count; i++) names[i] = t->info[i].name;
    qsort(names, (size_t)t->count, sizeof *names, mc__ckpt_str_cmp);
    for (i = 1; i < t->count && rc == MC_OK; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            rc = MC__FAIL(MC_ERR_INVALID_DESC, "%s: parameter name %s appears twice in the table",
                          cx->fn, names[i]);
    mc_free(names);
    return rc;
}

/* ---- shard geometry: the stride rule as contiguous runs */

/* A parameter seen as [outer, dim, inner] around its split dimension; the local shard holds
   `stride` pieces of ldim / stride along dim, local piece k being global piece k * tp + rank. */
typedef struct mc__ckpt_view {
    size_t outer, gdim, ldim, inner;
    size_t stride, tp, tp_rank;
} mc__ckpt_view;

static void mc__ckpt_view_of(mc__ckpt_view *v, const mc_param_info *p, int tp, int tp_rank) {
    size_t g0 = (size_t)p->global_shape[0];
    size_t g1 = p->ndim == 2 ? (size_t)p->global_shape[1] : 1;
    if (p->partition_dim < 0) {   /* replicated: one run, the whole tensor */
        v->outer = v->inner = v->stride = v->tp = 1;
        v->gdim = v->ldim = g0 * g1;
        v->tp_rank = 0;
        return;
    }
    v->outer = p->partition_dim == 0 ? 1 : g0;
    v->inner = p->partition_dim == 0 ? g1 : 1;
    v->gdim = p->partition_dim == 0 ? g0 : g1;
    v->ldim = v->gdim / (size_t)tp;
    v->stride = (size_t)MC__DEF(p->partition_stride, 1);
    v->tp = (size_t)tp;
    v->tp_rank = (size_t)tp_rank;
}

static size_t mc__ckpt_n_runs(const mc__ckpt_view *v) { return v->outer * v->stride; }

/* Run q: `len` elements at element `local` of the shard and element `global` of the tensor. */
static void mc__ckpt_run(const mc__ckpt_view *v, size_t q, size_t *local, size_t *global,
                         size_t *len) {
    size_t o = q / v->stride, k = q % v->stride, piece = v->ldim / v->stride;
    *local = (o * v->ldim + k * piece) * v->inner;
    *global = (o * v->gdim + (k * v->tp + v->tp_rank) * piece) * v->inner;
    *len = piece * v->inner;
}

/* Runs *q.. merged while they stay contiguous on both sides (TP = 1, stride 1). */
static void mc__ckpt_next_run(const mc__ckpt_view *v, size_t *q, size_t *local, size_t *global,
                              size_t *len) {
    size_t n = mc__ckpt_n_runs(v), lo, go, ln;
    mc__ckpt_run(v, (*q)++, local, global, len);
    while (*q < n) {
        mc__ckpt_run(v, *q, &lo, &go, &ln);
        if (lo != *local + *len || go != *global + *len) break;
        *len += ln;
        (*q)++;
    }
}

/* ---- save */

static int mc__ckpt_check_same(const mc__ckpt_ctx *cx) {
    static const char *const what[7] = {
        "iteration", "consumed_samples", "optimizer_step", "the math fingerprint of the config",
        "the layout fingerprint of the config", "whether exp_avg / exp_avg_sq are given",
        "whether rng is given"};
    const mc_checkpoint_desc *d = cx->d;
    int64_t v[7], lo[7], hi[7];
    uint64_t fp;
    int i, rc;
    v[0] = d->iteration;
    v[1] = d->consumed_samples;
    v[2] = d->optimizer_step;
    fp = mc_gpt_config_math_fingerprint(d->config);
    memcpy(&v[3], &fp, 8);
    fp = mc_gpt_config_layout_fingerprint(d->config);
    memcpy(&v[4], &fp, 8);
    v[5] = cx->optim;
    v[6] = d->rng != NULL;
    rc = mc_host_collective(cx->world, MC_COLL_ALL_REDUCE, v, lo, 7, MC_I64, MC_MIN, 0);
    if (rc == MC_OK) rc = mc_host_collective(cx->world, MC_COLL_ALL_REDUCE, v, hi, 7, MC_I64,
                                             MC_MAX, 0);
    if (rc != MC_OK) return rc;
    for (i = 0; i < 7; i++)
        if (lo[i] != hi[i])
            return MC__FAIL(MC_ERR_INVALID_ARG, "%s: ranks disagree on %s (%lld on some, %lld on "
                            "others)", cx->fn, what[i], (long long)lo[i], (long long)hi[i]);
    return MC_OK;
}

/* Rank 0: the root directory exists, a stale <iter>.tmp is gone, a fresh one is made. */
static int mc__ckpt_prepare_dir(const char *dir, const char *tmp) {
    int rc = mc__ckpt_mkdirs(dir);
    if (rc != MC_OK) return rc;
    if (mc__ckpt_exists(tmp)) {
        rc = mc__ckpt_remove_dir(tmp);
        if (rc != MC_OK) return rc;
        MC__INFO("checkpoint: removed %s, left by a save that did not finish", tmp);
    }
    if (mkdir(tmp, 0755) != 0) return mc__ckpt_os_fail("cannot create", tmp);
    return MC_OK;
}

/* Writes this rank's shard of one tensor of `kind` at its global offsets. */
static int mc__ckpt_write_tensor(const mc__ckpt_ctx *cx, const char *tmp, int kind,
                                 const mc_param_info *p, size_t *written) {
    char file[MC_CKPT_FILE_MAX + 16], path[MC_CKPT_PATH_MAX];
    unsigned char h[MC_CKPT_HEADER_BYTES];
    const float *src = cx->data[kind] + p->offset;   /* local shard, row-major */
    mc__ckpt_view v;
    size_t q = 0, lo, go, len;
    int fd, rc;
    snprintf(file, sizeof file, "%s.%s.bin", mc__ckpt_kinds[kind], p->name);
    rc = mc__ckpt_join(path, tmp, file);
    if (rc != MC_OK) return rc;
    /* No O_TRUNC: the other TP ranks write into the same (fresh) file. */
    fd = open(path, O_WRONLY | O_CREAT, 0644);
    if (fd < 0) return mc__ckpt_os_fail("cannot create", path);
    mc__ckpt_view_of(&v, p, cx->tp, cx->tp_rank);
    if (v.tp_rank == 0) {   /* the rank holding element 0 writes the header */
        mc__ckpt_header(h, p->ndim, p->global_shape[0], p->ndim == 2 ? p->global_shape[1] : 1);
        rc = mc__ckpt_write_at(fd, h, sizeof h, 0, path);
    }
    *written = 0;
    while (rc == MC_OK && q < mc__ckpt_n_runs(&v)) {
        mc__ckpt_next_run(&v, &q, &lo, &go, &len);
        rc = mc__ckpt_write_at(fd, src + lo, len * sizeof(float),
                               MC_CKPT_HEADER_BYTES + (long long)(go * sizeof(float)), path);
        *written += len;
    }
    if (rc == MC_OK && fsync(fd) != 0) rc = mc__ckpt_os_fail("cannot fsync", path);
    if (close(fd) != 0 && rc == MC_OK) rc = mc__ckpt_os_fail("cannot close", path);
    return rc;
}

static void mc__ckpt_rng_file_name(char *out, size_t cap, int pp, int tp) {
    snprintf(out, cap, "rng_pp%03d_tp%02d.txt", pp, tp);
}

static int mc__ckpt_write_rng(const mc__ckpt_ctx *cx, const char *tmp, char *file, size_t cap) {
    char path[MC_CKPT_PATH_MAX];
    mc_rng_states st;
    mc__ckpt_sb sb;
    int i, rc = mc_rng_tracker_get_states(cx->d->rng, &st);
    const char *c;
    if (rc != MC_OK) return rc;
    memset(&sb, 0, sizeof sb);
    mc__ckpt_sb_printf(&sb, "megatron_c-rng 1\nposition pp %d tp %d\ncurrent %llu %llu\n", cx->pp_rank,
                  cx->tp_rank, (unsigned long long)st.current.seed,
                  (unsigned long long)st.current.offset);
    for (i = 0; i < st.n_streams; i++) {
        for (c = st.names[i]; *c; c++)
            if (*c <= ' ' || *c == 127) break;
        if (*c || !st.names[i][0]) {
            mc__ckpt_sb_free(&sb);
            return MC__FAIL(MC_ERR_INVALID_ARG, "%s: RNG stream name \"%s\" is empty or holds "
                            "white space", cx->fn, st.names[i]);
        }
        mc__ckpt_sb_printf(&sb, "stream %s %llu %llu\n", st.names[i],
                      (unsigned long long)st.streams[i].seed,
                      (unsigned long long)st.streams[i].offset);
    }
    mc__ckpt_rng_file_name(file, cap, cx->pp_rank, cx->tp_rank);
    rc = sb.oom ? MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", cx->fn)
                : mc__ckpt_join(path, tmp, file);
    if (rc == MC_OK) rc = mc__ckpt_write_file(path, sb.p, sb.len);
    mc__ckpt_sb_free(&sb);
    return rc;
}

/* Main replicas write their shards; every rank reports what it wrote, one line each:
   "tensor RANK KIND NAME NDIM D0 D1 ELEMENTS" and "rng RANK PP TP FILE". */
static int mc__ckpt_write_shards(const mc__ckpt_ctx *cx, const char *tmp, mc__ckpt_sb *report) {
    const mc_param_table *t = cx->d->params;
    char file[32];
    int i, k, rc = MC_OK;
    if (!cx->main_replica) return MC_OK;
    for (i = 0; i < t->count && rc == MC_OK; i++) {
        const mc_param_info *p = &t->info[i];
        if (p->shared) continue;                                /* the tied copy: not a main replica */
        if (p->partition_dim < 0 && cx->tp_rank != 0) continue; /* replicated over TP */
        for (k = 0; k < (cx->optim ? 3 : 1) && rc == MC_OK; k++) {
            size_t written = 0;
            rc = mc__ckpt_write_tensor(cx, tmp, k, p, &written);
            mc__ckpt_sb_printf(report, "tensor %d %s %s %d %d %d %zu\n", cx->rank, mc__ckpt_kinds[k],
                          p->name, p->ndim, p->global_shape[0],
                          p->ndim == 2 ? p->global_shape[1] : 1, written);
        }
    }
    if (rc == MC_OK && cx->d->rng) {
        rc = mc__ckpt_write_rng(cx, tmp, file, sizeof file);
        mc__ckpt_sb_printf(report, "rng %d %d %d %s\n", cx->rank, cx->pp_rank, cx->tp_rank, file);
    }
    if (rc == MC_OK && report->oom) rc = MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", cx->fn);
    return rc;
}

/* Every rank receives every rank's text: slot r of *all (slot bytes each) is rank r's. */
static int mc__ckpt_allgather_text(const mc__ckpt_ctx *cx, const mc__ckpt_sb *mine, char **all,
                                   size_t *slot) {
    int64_t len = (int64_t)mine->len + 1, max_len = 0;
    char *send;
    int rc = mc_host_collective(cx->world, MC_COLL_ALL_REDUCE, &len, &max_len, 1, MC_I64, MC_MAX,
                                0);
    *all = NULL;
    if (rc != MC_OK) return rc;
    send = (char *)mc_calloc((size_t)max_len, 1);
    *all = (char *)mc_calloc((size_t)max_len * (size_t)cx->size, 1);
    rc = (send && *all) ? MC_OK : MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", cx->fn);
    rc = mc__ckpt_agree(cx->world, rc);
    if (rc == MC_OK) {
        if (mine->len) memcpy(send, mine->p, mine->len);
        rc = mc_host_collective(cx->world, MC_COLL_ALL_GATHER, send, *all, (size_t)max_len, MC_U8,
                                MC_SUM, 0);
    }
    mc_free(send);
    if (rc != MC_OK) {
        mc_free(*all);
        *all = NULL;
    }
    *slot = (size_t)max_len;
    return rc;
}

typedef struct mc__ckpt_entry {
    mc_checkpoint_tensor t;
    long long written;
    int rank;
} mc__ckpt_entry;

static int mc__ckpt_entry_cmp(const void *a, const void *b) {
    return mc__ckpt_tensor_cmp(&((const mc__ckpt_entry *)a)->t, &((const mc__ckpt_entry *)b)->t);
}

/* Parses one report line into *e or *r; returns 1 tensor, 2 rng, 0 bad. */
static int mc__ckpt_parse_report_line(char *line, mc__ckpt_entry *e, mc_checkpoint_rng_file *r) {
    char *tok[MC__CKPT_MAX_TOKENS];
    long long v[6];
    int n = mc__ckpt_split(line, tok), i;
    if (n == 8 && strcmp(tok[0], "tensor") == 0) {
        if (!mc__ckpt_parse_ll(tok[1], &v[0]) || !mc__ckpt_parse_ll(tok[4], &v[1]) ||
            !mc__ckpt_parse_ll(tok[5], &v[2]) || !mc__ckpt_parse_ll(tok[6], &v[3]) ||
            !mc__ckpt_parse_ll(tok[7], &v[4]) || strlen(tok[2]) >= sizeof e->t.kind ||
            strlen(tok[3]) >= sizeof e->t.name)
            return 0;
        memset(e, 0, sizeof *e);
        e->rank = (int)v[0];
        strcpy(e->t.kind, tok[2]);
        strcpy(e->t.name, tok[3]);
        e->t.ndim = (int)v[1];
        e->t.shape[0] = v[2];
        e->t.shape[1] = v[3];
        e->written = v[4];
        return 1;
    }
    if (n == 5 && strcmp(tok[0], "rng") == 0) {
        for (i = 0; i < 3; i++)
            if (!mc__ckpt_parse_ll(tok[1 + i], &v[i])) return 0;
        if (strlen(tok[4]) >= sizeof r->file) return 0;
        memset(r, 0, sizeof *r);
        r->pp = (int)v[1];
        r->tp = (int)v[2];
        strcpy(r->file, tok[4]);
        return 2;
    }
    return 0;
}

/* Builds the metadata's tensor and rng lists from every rank's report, checking that the ranks
   agree on each tensor's shape and that its elements were written exactly once. */
static int mc__ckpt_merge(const mc__ckpt_ctx *cx, char *all, size_t slot, mc_checkpoint_meta *m) {
    mc__ckpt_entry *e = NULL, one;
    mc_checkpoint_rng_file r;
    char sa[48], sb[48];
    int n_e = 0, cap_e = 0, cap_r = 0, cap_t = 0, i, j, rc = MC_OK, src_rank;
    void *grown;
    for (src_rank = 0; src_rank < cx->size && rc == MC_OK; src_rank++) {
        char *line = all + (size_t)src_rank * slot;
        all[(size_t)src_rank * slot + slot - 1] = '\0';
        while (*line && rc == MC_OK) {
            char *nl = strchr(line, '\n');
            int kind;
            if (nl) *nl = '\0';
            kind = mc__ckpt_parse_report_line(line, &one, &r);
            if (kind == 0)
                rc = MC__FAIL(MC_ERR_STATE, "%s: rank %d reported an unreadable line", cx->fn,
                              src_rank);
            else if (kind == 1) {
                grown = mc__ckpt_grow(e, &cap_e, n_e + 1, sizeof *e);
                if (!grown) rc = MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", cx->fn);
                else {
                    e = (mc__ckpt_entry *)grown;
                    e[n_e++] = one;
                }
            } else {
                grown = mc__ckpt_grow(m->rng, &cap_r, m->n_rng + 1, sizeof r);
                if (!grown) rc = MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", cx->fn);
                else {
                    m->rng = (mc_checkpoint_rng_file *)grown;
                    m->rng[m->n_rng++] = r;
                }
            }
            if (!nl) break;
            line = nl + 1;
        }
    }
    if (rc == MC_OK && n_e > 1) qsort(e, (size_t)n_e, sizeof *e, mc__ckpt_entry_cmp);
    for (i = 0; i < n_e && rc == MC_OK; i = j) {
        mc_checkpoint_tensor t = e[i].t;
        long long written = 0, numel = t.shape[0] * t.shape[1];
        for (j = i; j < n_e && mc__ckpt_tensor_cmp(&e[j].t, &t) == 0; j++) {
            if (e[j].t.ndim != t.ndim || e[j].t.shape[0] != t.shape[0] ||
                e[j].t.shape[1] != t.shape[1])
                rc = MC__FAIL(MC_ERR_INVALID_DESC,
                              "%s: %s %s has global shape %s on rank %d but %s on rank %d",
                              cx->fn, t.kind, t.name,
                              mc__ckpt_shape_str(sa, sizeof sa, t.ndim, t.shape[0], t.shape[1]),
                              e[i].rank,
                              mc__ckpt_shape_str(sb, sizeof sb, e[j].t.ndim, e[j].t.shape[0],
                                                 e[j].t.shape[1]),
                              e[j].rank);
            written += e[j].written;
        }
        if (rc == MC_OK && written != numel)
            rc = MC__FAIL(MC_ERR_INVALID_DESC,
                          "%s: %s %s: the main replicas wrote %lld of its %lld elements (first "
                          "writer rank %d): every shard needs exactly one writer (check "
                          "partition_dim, the shared flag and that every stage holds its layers)",
                          cx->fn, t.kind, t.name, written, numel, e[i].rank);
        if (rc != MC_OK) break;
        snprintf(t.file, sizeof t.file, "%s.%s.bin", t.kind, t.name);
        t.bytes = MC_CKPT_HEADER_BYTES + 4 * numel;
        grown = mc__ckpt_grow(m->tensors, &cap_t, m->n_tensors + 1, sizeof t);
        if (!grown) {
            rc = MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", cx->fn);
            break;
        }
        m->tensors = (mc_checkpoint_tensor *)grown;
        m->tensors[m->n_tensors++] = t;
    }
    mc_free(e);
    if (rc == MC_OK && m->n_rng > 1) qsort(m->rng, (size_t)m->n_rng, sizeof *m->rng, mc__ckpt_rng_cmp);
    if (rc == MC_OK && cx->d->rng && m->n_rng != cx->tp * cx->pp)
        rc = MC__FAIL(MC_ERR_STATE, "%s: %d RNG files for %d (pp, tp) positions", cx->fn, m->n_rng,
                      cx->tp * cx->pp);
    return rc;
}

static int mc__ckpt_file_crc(const char *path, long long *bytes, uint32_t *crc) {
    enum { CHUNK = 1 << 20 };
    unsigned char *buf;
    int rc = MC_OK, fd = open(path, O_RDONLY);
    *bytes = 0;
    *crc = 0;
    if (fd < 0) return mc__ckpt_os_fail("cannot open", path);
    buf = (unsigned char *)mc_malloc(CHUNK);
    if (!buf) rc = MC__FAIL(MC_ERR_NO_MEMORY, "checkpoint: out of memory checking %s", path);
    while (rc == MC_OK) {
        ssize_t n = read(fd, buf, CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) rc = mc__ckpt_os_fail("cannot read", path);
        if (n <= 0) break;
        *crc = mc_crc32(*crc, buf, (size_t)n);
        *bytes += n;
    }
    mc_free(buf);
    close(fd);
    return rc;
}

/* File i of the metadata (tensors first, then rng files). */
static void mc__ckpt_file_of(const mc_checkpoint_meta *m, int i, const char **name,
                             long long **bytes, uint32_t **crc) {
    if (i < m->n_tensors) {
        *name = m->tensors[i].file;
        *bytes = &m->tensors[i].bytes;
        *crc = &m->tensors[i].crc32;
    } else {
        *name = m->rng[i - m->n_tensors].file;
        *bytes = &m->rng[i - m->n_tensors].bytes;
        *crc = &m->rng[i - m->n_tensors].crc32;
    }
}

/* The CRC32 and size of every file, spread over the world (file i on rank i mod size).
   verify = 0 (save): fills m's bytes and crc32 from the sums; the tensor sizes must be what
   the shapes say. verify = 1 (load): compares with m. Agreed over the world. */
static int mc__ckpt_checksums(const mc__ckpt_ctx *cx, const char *dir, mc_checkpoint_meta *m,
                              int verify) {
    int n = m->n_tensors + m->n_rng, i, rc = MC_OK;
    int64_t *mine = (int64_t *)mc_calloc((size_t)(2 * n + 1), sizeof(int64_t));
    int64_t *sum = (int64_t *)mc_calloc((size_t)(2 * n + 1), sizeof(int64_t));
    char path[MC_CKPT_PATH_MAX];
    if (!mine || !sum) rc = MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", cx->fn);
    for (i = cx->rank; i < n && rc == MC_OK; i += cx->size) {
        const char *name;
        long long *bytes, got_bytes;
        uint32_t *crc, got_crc;
        mc__ckpt_file_of(m, i, &name, &bytes, &crc);
        rc = mc__ckpt_join(path, dir, name);
        if (rc == MC_OK) rc = mc__ckpt_file_crc(path, &got_bytes, &got_crc);
        if (rc != MC_OK) break;
        mine[2 * i] = got_bytes;
        mine[2 * i + 1] = got_crc;
        if (verify && got_bytes != *bytes)
            rc = MC__FAIL(MC_ERR_IO, "checkpoint file %s: %lld bytes, %s says %lld (the file is %s)",
                          path, got_bytes, MC_CKPT_METADATA_FILE, *bytes,
                          got_bytes < *bytes ? "truncated" : "longer than written");
        else if (verify && got_crc != *crc)
            rc = MC__FAIL(MC_ERR_IO, "checkpoint file %s: CRC32 %08lx, %s says %08lx (the file is "
                          "corrupted)", path, (unsigned long)got_crc, MC_CKPT_METADATA_FILE,
                          (unsigned long)*crc);
    }
    rc = mc__ckpt_agree(cx->world, rc);
    if (rc == MC_OK && !verify)
        rc = mc_host_collective(cx->world, MC_COLL_ALL_REDUCE, mine, sum, (size_t)(2 * n + 1),
                                MC_I64,
                                MC_SUM, 0);
    for (i = 0; i < n && rc == MC_OK && !verify; i++) {
        const char *name;
        long long *bytes;
        uint32_t *crc;
        mc__ckpt_file_of(m, i, &name, &bytes, &crc);
        if (i < m->n_tensors && sum[2 * i] != *bytes)
            rc = MC__FAIL(MC_ERR_IO, "%s: %s has %lld bytes after the save, %lld expected", cx->fn,
                          name, (long long)sum[2 * i], *bytes);
        *bytes = sum[2 * i];
        *crc = (uint32_t)sum[2 * i + 1];
    }
    mc_free(mine);
    mc_free(sum);
    return rc;
}

/* Rank 0: metadata (temp + fsync + rename), the directory rename, then `latest`. */
static int mc__ckpt_finish(const mc__ckpt_ctx *cx, const mc_checkpoint_meta *m, const char *tmp,
                           const char *final_dir) {
    const char *dir = cx->d->dir;
    char path[MC_CKPT_PATH_MAX], path_tmp[MC_CKPT_PATH_MAX], latest[64];
    mc__ckpt_sb sb;
    int rc;
    memset(&sb, 0, sizeof sb);
    mc__ckpt_format_metadata(&sb, m);
    if (sb.oom) return MC__FAIL(MC_ERR_NO_MEMORY, "%s: out of memory", cx->fn);
    rc = mc__ckpt_join(path, tmp, MC_CKPT_METADATA_FILE);
    if (rc == MC_OK) rc = mc__ckpt_join(path_tmp, tmp, MC_CKPT_METADATA_FILE ".tmp");
    if (rc == MC_OK) rc = mc__ckpt_write_file(path_tmp, sb.p, sb.len);
    mc__ckpt_sb_free(&sb);
    if (rc == MC_OK && rename(path_tmp, path) != 0) rc = mc__ckpt_os_fail("cannot rename", path_tmp);
    if (rc == MC_OK) rc = mc__ckpt_fsync_dir(tmp);
    /* Saving an iteration again replaces its directory. */
    if (rc == MC_OK && mc__ckpt_exists(final_dir)) rc = mc__ckpt_remove_dir(final_dir);
    if (rc == MC_OK && rename(tmp, final_dir) != 0) rc = mc__ckpt_os_fail("cannot rename", tmp);
    if (rc == MC_OK) rc = mc__ckpt_fsync_dir(dir);
    if (rc != MC_OK) return rc;
    if (m->iteration == MC_CKPT_RELEASE)
        snprintf(latest, sizeof latest, "release\n");
    else
        snprintf(latest, sizeof latest, "%lld\n", m->iteration);
    rc = mc__ckpt_join(path, dir, MC_CKPT_LATEST_FILE);
    if (rc == MC_OK) rc = mc__ckpt_join(path_tmp, dir, MC_CKPT_LATEST_FILE ".tmp");
    if (rc == MC_OK) rc = mc__ckpt_write_file(path_tmp, latest, strlen(latest));
    if (rc == MC_OK && rename(path_tmp, path) != 0) rc = mc__ckpt_os_fail("cannot rename", path_tmp);
    if (rc == MC_OK) rc = mc__ckpt_fsync_dir(dir);
    return rc;
}

static int mc__ckpt_save_host(const mc_checkpoint_desc *desc) {
    mc__ckpt_ctx cx;
    mc_checkpoint_meta meta;
    mc__ckpt_sb report;
    char final_dir[MC_CKPT_PATH_MAX], tmp[MC_CKPT_PATH_MAX], *all = NULL;
    size_t slot = 0;
    int rc, tmp_made = 0;
    memset(&meta, 0, sizeof meta);
    memset(&report, 0, sizeof report);
    rc = mc__ckpt_begin(&cx, desc, "mc_checkpoint_save");
    if (rc != MC_OK) return rc;
    rc = mc__ckpt_validate(&cx);
    if (rc == MC_OK && (desc->iteration < 0 || desc->consumed_samples < 0 || desc->optimizer_step < 0))
        rc = MC__FAIL(MC_ERR_INVALID_ARG,
                      "mc_checkpoint_save: iteration (%lld), consumed_samples (%lld) and "
                      "optimizer_step (%lld) must be >= 0", desc->iteration,
                      desc->consumed_samples, desc->optimizer_step);
    if (rc == MC_OK) rc = mc_checkpoint_iteration_dir(final_dir, sizeof final_dir, desc->dir,
                                                      desc->iteration);
    if (rc == MC_OK && snprintf(tmp, sizeof tmp, "%s.tmp", final_dir) >= (int)sizeof tmp)
        rc = MC__FAIL(MC_ERR_INVALID_ARG, "mc_checkpoint_save: path %s.tmp is too long", final_dir);
    MC__CKPT_AGREE(&cx, rc);
    rc = mc__ckpt_check_same(&cx);   /* the same verdict on every rank */
    if (rc != MC_OK) goto done;

    if (cx.rank == 0) rc = mc__ckpt_prepare_dir(desc->dir, tmp);
    MC__CKPT_AGREE(&cx, rc);
    tmp_made = 1;
    rc = mc__ckpt_write_shards(&cx, tmp, &report);
    MC__CKPT_AGREE(&cx, rc);

    rc = mc__ckpt_allgather_text(&cx, &report, &all, &slot);
    if (rc != MC_OK) goto done;
    rc = mc__ckpt_merge(&cx, all, slot, &meta);
    MC__CKPT_AGREE(&cx, rc);
    rc = mc__ckpt_checksums(&cx, tmp, &meta, 0);
    if (rc != MC_OK) goto done;

    meta.format_version = MC_CKPT_FORMAT_VERSION;
    meta.big_endian = mc__ckpt_host_big_endian();
    meta.iteration = desc->iteration;
    meta.consumed_samples = desc->consumed_samples;
    meta.optimizer_step = desc->optimizer_step;
    meta.math_fingerprint = mc_gpt_config_math_fingerprint(desc->config);
    meta.layout_fingerprint = mc_gpt_config_layout_fingerprint(desc->config);
    meta.tp = cx.tp;
    meta.pp = cx.pp;
    meta.dp = cx.dp;
    meta.cp = cx.cp;
    meta.vpp = cx.vpp;
    meta.world = cx.size;
    mc_gpt_config_resolve(&meta.config, desc->config);   /* the file shows the defaults */
    if (cx.rank == 0) rc = mc__ckpt_finish(&cx, &meta, tmp, final_dir);
    MC__CKPT_AGREE(&cx, rc);
    if (cx.rank == 0)
        MC__INFO("checkpoint: saved %s (%d tensors, TP %d PP %d DP %d)", final_dir,
                 meta.n_tensors, cx.tp, cx.pp, cx.dp);
done:
    if (rc != MC_OK && tmp_made && cx.rank == 0 && mc__ckpt_exists(tmp)) {
        /* Best effort, keeping the error being reported: the next save removes it anyway. */
        char keep[MC__ERROR_LEN];
        memcpy(keep, mc__last_error_text, sizeof keep);
        mc__ckpt_remove_dir(tmp);
        memcpy(mc__last_error_text, keep, sizeof keep);
    }
    mc_free(all);
    mc__ckpt_sb_free(&report);
    mc_checkpoint_meta_destroy(&meta);
    return rc;
}

/* ---- load */

/* Rank 0: which iteration, its directory, and the metadata text. */
static int mc__ckpt_read_metadata_text(const mc__ckpt_ctx *cx, unsigned flags, long long *it,
                                       char *iter_dir, char **text, size_t *len) {
    char path[MC_CKPT_PATH_MAX];
    int rc = MC_OK;
    if (flags & MC_CKPT_LOAD_ITERATION) {
        *it = cx->d->iteration;
        if (*it < 0 && *it != MC_CKPT_RELEASE)
            return MC__FAIL(MC_ERR_INVALID_ARG, "%s: desc->iteration (%lld) must be >= 0 or "
                            "MC_CKPT_RELEASE", cx->fn, *it);
    } else {
        rc = mc_checkpoint_latest(cx->d->dir, it);
        if (rc != MC_OK) return rc;
    }
    rc = mc_checkpoint_iteration_dir(iter_dir, MC_CKPT_PATH_MAX, cx->d->dir, *it);
    if (rc != MC_OK) return rc;
    if (!mc__ckpt_exists(iter_dir))
        return MC__FAIL(MC_ERR_IO, "%s: checkpoint directory %s does not exist%s", cx->fn,
                        iter_dir, (flags & MC_CKPT_LOAD_ITERATION) ? ""
                                  : " (" MC_CKPT_LATEST_FILE " names it)");
    rc = mc__ckpt_join(path, iter_dir, MC_CKPT_METADATA_FILE);
    if (rc != MC_OK) return rc;
    if (!mc__ckpt_exists(path))
        return MC__FAIL(MC_ERR_IO, "%s: %s has no %s: not a complete checkpoint (a save that did "
                        "not finish, or another format)", cx->fn, iter_dir, MC_CKPT_METADATA_FILE);
    return mc__ckpt_read_file(path, text, len, (size_t)1 << 30);
}

/* Byte order and the math fingerprint (the layout may differ). */
static int mc__ckpt_check_compat(const mc__ckpt_ctx *cx, const mc_checkpoint_meta *m,
                                 const char *iter_dir, unsigned flags, mc_checkpoint_result *res) {
    char diff[640];
    uint64_t now = mc_gpt_config_math_fingerprint(cx->d->config);
    int n;
    if (m->big_endian != mc__ckpt_host_big_endian())
        return MC__FAIL(MC_ERR_UNSUPPORTED, "%s: %s holds %s-endian tensors, this host is %s-endian",
                        cx->fn, iter_dir, m->big_endian ? "big" : "little",
                        m->big_endian ? "little" : "big");
    if (m->math_fingerprint == now) return MC_OK;
    diff[0] = '\0';
    n = mc_gpt_config_math_diff(&m->config, cx->d->config, diff, sizeof diff);
    if (n <= 0)
        snprintf(diff, sizeof diff, "no config field differs, so the fingerprint itself changed "
                 "(another megatron_c version?)");
    if (!(flags & MC_CKPT_LOAD_IGNORE_MATH))
        return MC__FAIL(MC_ERR_INVALID_DESC,
                        "%s: %s was saved for another model (math fingerprint %016llx, the current "
                        "config has %016llx): %s (saved vs current). Loading needs the same math "
                        "config; MC_CKPT_LOAD_IGNORE_MATH overrides this check", cx->fn, iter_dir,
                        (unsigned long long)m->math_fingerprint, (unsigned long long)now, diff);
    MC__WARN("%s: loading %s despite a math config mismatch (MC_CKPT_LOAD_IGNORE_MATH): %s",
             cx->fn, iter_dir, diff);
    res->math_mismatch_ignored = 1;
    return MC_OK;
}

/* Where each local parameter comes from: tensors[3] per parameter (model, m, v). */
static int mc__ckpt_plan(const mc__ckpt_ctx *cx, const mc_checkpoint_meta *m,
                         const mc_checkpoint_tensor **src) {
    const mc_param_table *t = cx->d->params;
    long long padded_then = mc__ckpt_padded_vocab(&m->config, m->tp);
    long long padded_now = mc__ckpt_padded_vocab(cx->d->config, cx->tp);
    char a[48], b[48];
    int i, k;
    for (i = 0; i < t->count; i++) {
        const mc_param_info *p = &t->info[i];
        const char *key = p->shared ? MC_CKPT_TIED_KEY : p->name;
        long long g0 = p->global_shape[0], g1 = p->ndim == 2 ? p->global_shape[1] : 1;
        for (k = 0; k < (cx->optim ? 3 : 1); k++) {
            const mc_checkpoint_tensor *s = mc_checkpoint_meta_find(m, mc__ckpt_kinds[k], key);
            src[3 * i + k] = s;
            if (!s && k == 0)
                return MC__FAIL(MC_ERR_IO, "%s: the checkpoint has no tensor %s (parameter %s%s)",
                                cx->fn, key, p->name, p->shared ? ", the tied copy" : "");
            if (!s)
                return MC__FAIL(MC_ERR_IO, "%s: the checkpoint holds no %s for %s (saved without "
                                "optimizer state?); pass exp_avg = exp_avg_sq = NULL to load the "
                                "model alone", cx->fn, mc__ckpt_kinds[k], key);
            if (s->ndim == p->ndim && s->shape[0] == g0 && s->shape[1] == g1) continue;
            /* Vocabulary padding depends on TP: rows past the vocabulary may come and go. */
            if (s->ndim == 2 && p->ndim == 2 && s->shape[1] == g1 && p->partition_dim <= 0 &&
                padded_then > 0 && s->shape[0] == padded_then && g0 == padded_now)
                continue;
            return MC__FAIL(MC_ERR_INVALID_DESC,
                            "%s: tensor %s has shape %s in the checkpoint, but parameter %s of the "
                            "current model has global shape %s", cx->fn, key,
                            mc__ckpt_shape_str(a, sizeof a, s->ndim, s->shape[0], s->shape[1]),
                            p->name, mc__ckpt_shape_str(b, sizeof b, p->ndim, g0, g1));
        }
    }
    return MC_OK;
}

/* Reads the slices of the current layout of tensor s into dst (the local shard). Rows that
   the stored tensor does not have (vocabulary padding) become 0. */
static int mc__ckpt_read_tensor(const mc__ckpt_ctx *cx, const char *iter_dir,
                                const mc_checkpoint_tensor *s, const mc_param_info *p,
                                float *dst) {
    char path[MC_CKPT_PATH_MAX];
    unsigned char h[MC_CKPT_HEADER_BYTES], want[MC_CKPT_HEADER_BYTES];
    size_t stored = (size_t)mc__ckpt_numel(s), q = 0, lo, go, len, avail;
    mc__ckpt_view v;
    int fd, rc = mc__ckpt_join(path, iter_dir, s->file);
    if (rc != MC_OK) return rc;
    fd = open(path, O_RDONLY);
    if (fd < 0) return mc__ckpt_os_fail("cannot open", path);
    rc = mc__ckpt_read_at(fd, h, sizeof h, 0, path);
    mc__ckpt_header(want, s->ndim, s->shape[0], s->shape[1]);
    if (rc == MC_OK && memcmp(h, want, 8) != 0)
        rc = MC__FAIL(MC_ERR_IO, "%s: not a megatron_c tensor file (no MCTENSOR magic)", path);
    else if (rc == MC_OK && memcmp(h, want, sizeof h) != 0)
        rc = MC__FAIL(MC_ERR_IO, "%s: the header (version, dtype, ndim, byte order, shape) does "
                      "not match %s's [%lld, %lld] f32", path, MC_CKPT_METADATA_FILE, s->shape[0],
                      s->shape[1]);
    mc__ckpt_view_of(&v, p, cx->tp, cx->tp_rank);
    while (rc == MC_OK && q < mc__ckpt_n_runs(&v)) {
        mc__ckpt_next_run(&v, &q, &lo, &go, &len);
        avail = go >= stored ? 0 : (stored - go < len ? stored - go : len);
        if (avail > 0)
            rc = mc__ckpt_read_at(fd, dst + lo, avail * sizeof(float),
                                  MC_CKPT_HEADER_BYTES + (long long)(go * sizeof(float)), path);
        if (avail < len) memset(dst + lo + avail, 0, (len - avail) * sizeof(float));
    }
    close(fd);
    return rc;
}

static int mc__ckpt_parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    unsigned long long v;
    if (!s || !*s || *s == '-') return 0;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || !end || *end != '\0') return 0;
    *out = (uint64_t)v;
    return 1;
}

/* Parses an RNG file written by mc__ckpt_write_rng for position (pp, tp). */
static int mc__ckpt_parse_rng_file(char *text, const char *path, int pp, int tp,
                                   mc_rng_states *st) {
    char *line = text, *tok[MC__CKPT_MAX_TOKENS];
    int line_no = 0, n;
    long long a, b;
    memset(st, 0, sizeof *st);
    while (*line) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        line_no++;
        n = mc__ckpt_split(line, tok);
        if (line_no == 1) {
            if (n != 2 || strcmp(tok[0], "megatron_c-rng") != 0 || strcmp(tok[1], "1") != 0)
                return MC__FAIL(MC_ERR_IO, "%s line 1: expected \"megatron_c-rng 1\"", path);
        } else if (n == 5 && strcmp(tok[0], "position") == 0) {
            if (!mc__ckpt_parse_ll(tok[2], &a) || !mc__ckpt_parse_ll(tok[4], &b) || a != pp ||
                b != tp)
                return MC__FAIL(MC_ERR_IO, "%s line %d: position is \"%s %s\", expected pp %d tp %d",
                                path, line_no, tok[2], tok[4], pp, tp);
        } else if (n == 3 && strcmp(tok[0], "current") == 0) {
            if (!mc__ckpt_parse_u64(tok[1], &st->current.seed) ||
                !mc__ckpt_parse_u64(tok[2], &st->current.offset))
                return MC__FAIL(MC_ERR_IO, "%s line %d: current SEED OFFSET expected", path, line_no);
        } else if (n == 4 && strcmp(tok[0], "stream") == 0) {
            int k = st->n_streams;
            if (k == MC_RNG_MAX_STREAMS || strlen(tok[1]) >= MC_RNG_NAME_MAX)
                return MC__FAIL(MC_ERR_IO, "%s line %d: more than %d streams or a name longer than "
                                "%d", path, line_no, MC_RNG_MAX_STREAMS, MC_RNG_NAME_MAX - 1);
            strcpy(st->names[k], tok[1]);
            if (!mc__ckpt_parse_u64(tok[2], &st->streams[k].seed) ||
                !mc__ckpt_parse_u64(tok[3], &st->streams[k].offset))
                return MC__FAIL(MC_ERR_IO, "%s line %d: stream NAME SEED OFFSET expected", path,
                                line_no);
            st->n_streams++;
        } else {
            return MC__FAIL(MC_ERR_IO, "%s line %d: unknown line", path, line_no);
        }
        if (!nl) break;
        line = nl + 1;
    }
    if (line_no == 0) return MC__FAIL(MC_ERR_IO, "%s is empty", path);
    return MC_OK;
}

/* Restores this (pp, tp) position's RNG states when the checkpoint has them at the same TP and
   PP sizes; otherwise reseeds the tracker as at the start of training. */
static int mc__ckpt_restore_rng(const mc__ckpt_ctx *cx, const mc_checkpoint_meta *m,
                                const char *iter_dir, unsigned flags, mc_checkpoint_result *res) {
    const mc_checkpoint_rng_file *f = NULL;
    char path[MC_CKPT_PATH_MAX], why[160], *text = NULL;
    size_t len;
    mc_rng_states st;
    int i, rc, seed = MC__DEF(cx->d->config->seed, 1234);
    if (!cx->d->rng) return MC_OK;
    if (flags & MC_CKPT_LOAD_NO_RNG) {
        snprintf(res->note, sizeof res->note, "RNG states not loaded (MC_CKPT_LOAD_NO_RNG)");
        return MC_OK;
    }
    if (m->tp == cx->tp && m->pp == cx->pp)
        for (i = 0; i < m->n_rng; i++)
            if (m->rng[i].pp == cx->pp_rank && m->rng[i].tp == cx->tp_rank) f = &m->rng[i];
    if (f) {
        rc = mc__ckpt_join(path, iter_dir, f->file);
        if (rc == MC_OK) rc = mc__ckpt_read_file(path, &text, &len, (size_t)1 << 20);
        if (rc == MC_OK) rc = mc__ckpt_parse_rng_file(text, path, cx->pp_rank, cx->tp_rank, &st);
        if (rc == MC_OK) rc = mc_rng_tracker_set_states(cx->d->rng, &st);
        mc_free(text);
        if (rc == MC_OK) res->rng_restored = 1;
        return rc;
    }
    if (m->n_rng == 0)
        snprintf(why, sizeof why, "the checkpoint holds no RNG states");
    else if (m->tp != cx->tp || m->pp != cx->pp)
        snprintf(why, sizeof why, "saved at TP %d PP %d, loading at TP %d PP %d", m->tp, m->pp,
                 cx->tp, cx->pp);
    else
        snprintf(why, sizeof why, "no RNG state for pp %d tp %d", cx->pp_rank, cx->tp_rank);
    rc = mc_rng_tracker_seed_megatron(cx->d->rng, seed, cx->tp_rank, cx->pp_rank,
                                      cx->d->ps->coords.ep, cx->d->ps->coords.etp, 0, 0);
    snprintf(res->note, sizeof res->note,
             "RNG states reset: %s; the tracker was seeded from seed %d as at the start of "
             "training", why, seed);
    if (rc == MC_OK && cx->rank == 0) MC__INFO("%s: %s", cx->fn, res->note);
    return rc;
}

static int mc__ckpt_load_host(const mc_checkpoint_desc *desc, unsigned flags,
                              mc_checkpoint_result *result) {
    mc__ckpt_ctx cx;
    mc_checkpoint_meta meta;
    mc_checkpoint_result res;
    const mc_checkpoint_tensor **src = NULL;
    char iter_dir[MC_CKPT_PATH_MAX], meta_path[MC_CKPT_PATH_MAX], *text = NULL;
    size_t len = 0;
    long long it = 0;
    int64_t head[2];
    int rc, i, k;
    memset(&meta, 0, sizeof meta);
    memset(&res, 0, sizeof res);
    iter_dir[0] = '\0';
    if (result) memset(result, 0, sizeof *result);
    rc = mc__ckpt_begin(&cx, desc, "mc_checkpoint_load");
    if (rc != MC_OK) return rc;
    rc = mc__ckpt_validate(&cx);
    if (rc == MC_OK && (flags & ~(MC_CKPT_LOAD_ITERATION | MC_CKPT_LOAD_IGNORE_MATH |
                                  MC_CKPT_LOAD_NO_RNG)))
        rc = MC__FAIL(MC_ERR_INVALID_ARG, "mc_checkpoint_load: unknown flags 0x%x", flags);
    MC__CKPT_AGREE(&cx, rc);

    /* Rank 0 reads `latest` and the metadata once and hands them to everyone, so every rank
       decides from the same bytes. */
    if (cx.rank == 0) rc = mc__ckpt_read_metadata_text(&cx, flags, &it, iter_dir, &text, &len);
    MC__CKPT_AGREE(&cx, rc);
    head[0] = it;
    head[1] = (int64_t)len;
    rc = mc_host_collective(cx.world, MC_COLL_BROADCAST, head, head, 2, MC_I64, MC_SUM, 0);
    if (rc != MC_OK) goto done;
    it = head[0];
    len = (size_t)head[1];
    if (cx.rank != 0) {
        text = (char *)mc_calloc(len + 1, 1);
        rc = text ? mc_checkpoint_iteration_dir(iter_dir, sizeof iter_dir, desc->dir, it)
                  : MC__FAIL(MC_ERR_NO_MEMORY, "mc_checkpoint_load: out of memory");
    }
    MC__CKPT_AGREE(&cx, rc);
    if (len > 0) rc = mc_host_collective(cx.world, MC_COLL_BROADCAST, text, text, len, MC_U8,
                                         MC_SUM, 0);
    if (rc != MC_OK) goto done;
    rc = mc__ckpt_join(meta_path, iter_dir, MC_CKPT_METADATA_FILE);
    if (rc == MC_OK) rc = mc_checkpoint_parse_metadata(&meta, text, len, meta_path, desc->config);
    if (rc == MC_OK) rc = mc__ckpt_check_compat(&cx, &meta, iter_dir, flags, &res);
    MC__CKPT_AGREE(&cx, rc);

    src = (const mc_checkpoint_tensor **)mc_calloc((size_t)desc->params->count * 3 + 1,
                                                   sizeof *src);
    rc = src ? mc__ckpt_plan(&cx, &meta, src)
             : MC__FAIL(MC_ERR_NO_MEMORY, "mc_checkpoint_load: out of memory");
    MC__CKPT_AGREE(&cx, rc);
    rc = mc__ckpt_checksums(&cx, iter_dir, &meta, 1);
    if (rc != MC_OK) goto done;
    for (i = 0; i < desc->params->count && rc == MC_OK; i++)
        for (k = 0; k < (cx.optim ? 3 : 1) && rc == MC_OK; k++)
            rc = mc__ckpt_read_tensor(&cx, iter_dir, src[3 * i + k], &desc->params->info[i],
                                      cx.data[k] + desc->params->info[i].offset);
    MC__CKPT_AGREE(&cx, rc);
    rc = mc__ckpt_restore_rng(&cx, &meta, iter_dir, flags, &res);
    MC__CKPT_AGREE(&cx, rc);

    res.iteration = meta.iteration;
    res.consumed_samples = meta.consumed_samples;
    res.optimizer_step = meta.optimizer_step;
    res.saved_tp = meta.tp;
    res.saved_pp = meta.pp;
    res.saved_dp = meta.dp;
    res.saved_cp = meta.cp;
    res.saved_vpp = meta.vpp;
    res.saved_world = meta.world;
    res.resharded = meta.tp != cx.tp || meta.pp != cx.pp || meta.dp != cx.dp ||
                    meta.cp != cx.cp || meta.vpp != cx.vpp;
    res.optimizer_loaded = cx.optim;
    snprintf(res.path, sizeof res.path, "%s", iter_dir);
    if (result) *result = res;
    if (cx.rank == 0)
        MC__INFO("checkpoint: loaded %s (iteration %lld), saved at TP %d PP %d DP %d, now TP %d "
                 "PP %d DP %d", iter_dir, meta.iteration, meta.tp, meta.pp, meta.dp, cx.tp, cx.pp,
                 cx.dp);
done:
    mc_free(text);
    mc_free((void *)src);
    mc_checkpoint_meta_destroy(&meta);
    return rc;
}

#else /* _WIN32 */

static int mc__ckpt_save_host(const mc_checkpoint_desc *desc) {
    (void)desc;
    return MC__FAIL(MC_ERR_UNSUPPORTED, "mc_checkpoint_save needs POSIX file functions");
}

static int mc__ckpt_load_host(const mc_checkpoint_desc *desc, unsigned flags,
                              mc_checkpoint_result *result) {
    (void)desc;
    (void)flags;
    if (result) memset(result, 0, sizeof *result);
    return MC__FAIL(MC_ERR_UNSUPPORTED, "mc_checkpoint_load needs POSIX file functions");
}

#endif /* _WIN32 */

/* Device buffers (desc->ops not the CPU's) are staged through host copies: every rank
   downloads its three flat buffers, the host code saves or loads them, and a successful load
   uploads them again. The staging outcome is agreed over the world before any file work. */
static int mc__ckpt_stage(const mc_checkpoint_desc *desc, mc_checkpoint_desc *host,
                          float *mirror[3]) {
    const mc_ops *o = desc->ops;
    float *dev[3];
    size_t n = desc->params ? desc->params->total : 0;
    int k, rc = MC_OK, worst = MC_OK;
    *host = *desc;
    host->ops = NULL;
    dev[0] = desc->param_data;
    dev[1] = desc->exp_avg;
    dev[2] = desc->exp_avg_sq;
    for (k = 0; k < 3; k++) {
        mirror[k] = NULL;
        if (!dev[k] || rc != MC_OK) continue;
        mirror[k] = (float *)mc_calloc(n > 0 ? n : 1, sizeof(float));
        rc = mirror[k] ? o->download(o, mirror[k], dev[k], n * sizeof(float))
                       : MC__FAIL(MC_ERR_NO_MEMORY, "checkpoint: no host memory for %zu values",
                                  n);
    }
    host->param_data = mirror[0];
    host->exp_avg = mirror[1];
    host->exp_avg_sq = mirror[2];
    if (desc->ps && desc->ps->world &&
        mc_host_collective(desc->ps->world, MC_COLL_ALL_REDUCE, &rc, &worst, 1, MC_I32, MC_MIN,
                           0) == MC_OK &&
        rc == MC_OK && worst != MC_OK)
        rc = MC__FAIL(worst, "checkpoint: another rank could not stage its buffers (%s)",
                      mc_err_name(worst));
    return rc;
}

static int mc__ckpt_unstage(const mc_checkpoint_desc *desc, float *mirror[3], int upload) {
    float *dev[3];
    size_t n = desc->params ? desc->params->total : 0;
    int k, rc = MC_OK;
    dev[0] = desc->param_data;
    dev[1] = desc->exp_avg;
    dev[2] = desc->exp_avg_sq;
    for (k = 0; k < 3; k++) {
        if (upload && mirror[k] && rc == MC_OK)
            rc = desc->ops->upload(desc->ops, dev[k], mirror[k], n * sizeof(float));
        mc_free(mirror[k]);
    }
    return rc;
}

static int mc__ckpt_save(const mc_checkpoint_desc *desc) {
    mc_checkpoint_desc host;
    float *mirror[3];
    int rc;
    if (!desc || !desc->ops || desc->ops->device == MC_DEVICE_CPU)
        return mc__ckpt_save_host(desc);
    rc = mc__ckpt_stage(desc, &host, mirror);
    if (rc == MC_OK) rc = mc__ckpt_save_host(&host);
    mc__ckpt_unstage(desc, mirror, 0);
    return rc;
}

static int mc__ckpt_load(const mc_checkpoint_desc *desc, unsigned flags,
                         mc_checkpoint_result *result) {
    mc_checkpoint_desc host;
    float *mirror[3];
    int rc, up;
    if (!desc || !desc->ops || desc->ops->device == MC_DEVICE_CPU)
        return mc__ckpt_load_host(desc, flags, result);
    rc = mc__ckpt_stage(desc, &host, mirror);
    if (rc == MC_OK) rc = mc__ckpt_load_host(&host, flags, result);
    up = mc__ckpt_unstage(desc, mirror, rc == MC_OK);
    return rc != MC_OK ? rc : up;
}

MC_API int mc_checkpoint_save(const mc_checkpoint_desc *desc) {
    long long span = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, "checkpoint_save", -1, -1, NULL, 0, 1)
                               : -1;
    int rc = mc__ckpt_save(desc);
    if (span >= 0) mc__tl_close(span, rc, desc ? desc->ops : NULL, NULL);
    return rc;
}

MC_API int mc_checkpoint_load(const mc_checkpoint_desc *desc, unsigned flags,
                              mc_checkpoint_result *result) {
    long long span = MC__TL_ON ? mc__tl_open(MC_TIMELINE_SPAN, "checkpoint_load", -1, -1, NULL, 0, 1)
                               : -1;
    int rc = mc__ckpt_load(desc, flags, result);
    if (span >= 0) mc__tl_close(span, rc, desc ? desc->ops : NULL, NULL);
    return rc;
}

/* @checkpoint:implementation end */

/* @theoretical_memory:implementation begin */

// ---------------------------------------------------------------------------------------------
// >>training.theoretical_memory  (the models are described at the declarations)

/* UTF-8 middle dot and times sign. Always used between separate string literals: a hex escape
   followed by a hex digit in the same literal would swallow it. */
#define MC__MD "\xc2\xb7"
#define MC__MX " \xc3\x97 "

/* One stage's sizes, resolved; doubles so that products never overflow. */
typedef struct mc__mem {
    mc_gpt_config cfg;              /* resolved */
    int t, p, v, d, m, r, nl, sp, e, pre, post, out_layer, slots, selective, full, block, k;
    int tp_rank, dp_rank, dist, keep_stats;
    int ea;                         /* implementation: bytes of an activation / parameter */
    double s, b, h, a, f, vocab, pm, n, ns;   /* n = s·b tokens, ns = n / t under SP */
    double stats;                   /* floats the table's attention forward keeps per layer */
    size_t bucket_size;
    const mc_ops *ops;
} mc__mem;

MC_API const char *mc_memory_model_name(int model) {
    return model == MC_MEMORY_PAPER ? "paper"
           : model == MC_MEMORY_IMPLEMENTATION ? "implementation" : "unknown";
}

MC_API char *mc_memory_format_bytes(char *buf, size_t cap, double bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = bytes;
    int u = 0;
    if (!buf || cap == 0) return buf;
    while ((v >= 1024.0 || v <= -1024.0) && u < 6) v /= 1024.0, u++;
    if (u == 0) snprintf(buf, cap, "%.0f B", v);
    else snprintf(buf, cap, "%.*f %s", v >= 100.0 ? 1 : 2, v, units[u]);
    return buf;
}

/* Appends a term; the caller fills formula and values. */
static mc_memory_term *mc__mem_term(mc_memory_stage *st, mc_memory_model model,
                                    mc_memory_category cat, const char *name, double bytes) {
    mc_memory_term *t;
    MC_ASSERT(st->n_terms < MC_MEMORY_MAX_TERMS);
    t = &st->terms[st->n_terms++];
    memset(t, 0, sizeof *t);
    t->model = model;
    t->category = cat;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->bytes = bytes;
    st->bytes[model][cat] += bytes;
    st->total[model] += bytes;
    return t;
}

/* What one op-table allocation of n elements of `size` bytes takes (mc_gpt allocates at least
   one byte). */

static double mc__mem_round_up(double x, double m) { return ceil(x / m) * m; }

// --- parameters ------------------------------------------------------------------------------

/* Local element counts of one transformer layer's tensors, in registration order. */
static void mc__mem_layer_numel(const mc__mem *M, double numel[MC_GPT_LAYER_TENSORS]) {
    double h = M->h, f = M->f, t = M->t;
    double shapes[MC_GPT_LAYER_TENSORS] = {
        h, h, 3.0 * h * h / t, 3.0 * h / t, h * h / t, h, h, h, f * h / t, f / t, h * f / t, h};
    memcpy(numel, shapes, sizeof shapes);
}

/* P: the exact parameter count of one rank of the stage. */
static double mc__mem_params(const mc__mem *M) {
    double h = M->h, f = M->f, t = M->t;
    double layer = ((4.0 * h + 2.0 * f) * h + 3.0 * h + f) / t + 6.0 * h;
    double p = layer * M->nl * M->v;
    if (M->pre) p += M->vocab * h / t + M->pm * h;
    if (M->post) p += 2.0 * h + (M->out_layer ? M->vocab * h / t : 0.0);
    return p;
}

/* The layout of mc_param_table_layout replayed on counts (§11.3 padding), in layout order:
   each chunk's params in reverse registration order. */
typedef struct mc__mem_layout {
    const mc__mem *M;
    double start, bucket_start, end, align, bucket_size;
    long long in_bucket, first;     /* params in the open bucket, the index of its first */
    double owned;                   /* params with a part in this DP rank's shards */
    double owned_normed;            /* ... of them, those the grad norm sums on this TP rank */
} mc__mem_layout;

/* Param j (layout order) of chunk c: its local element count; *own: its own DDP bucket (the
   tied embedding pair under the distributed optimizer); *normed: the grad norm sums it on this
   TP rank (§12: not the tied copy; a replica only on TP rank 0). */
static double mc__mem_param_at(const mc__mem *M, int c, long long j, int *own, int *normed) {
    double numel[MC_GPT_LAYER_TENSORS], h = M->h;
    int tied = !M->cfg.untie_embeddings_and_output_weights, r0 = M->tp_rank == 0, t;
    long long head = 0, layers = (long long)M->nl * MC_GPT_LAYER_TENSORS;
    *own = 0;
    if (M->post && c == M->v - 1) {   /* output layer, final norm bias, weight */
        head = M->out_layer ? 3 : 2;
        if (j < head) {
            if (M->out_layer && j == 0) {
                *own = tied, *normed = !tied;
                return M->vocab * h / M->t;
            }
            *normed = r0;
            return h;
        }
    }
    j -= head;
    if (j < layers) {
        mc__mem_layer_numel(M, numel);
        t = MC_GPT_LAYER_TENSORS - 1 - (int)(j % MC_GPT_LAYER_TENSORS);
        *normed = r0 || t == MC_GPT_QKV_W || t == MC_GPT_QKV_B || t == MC_GPT_PROJ_W ||
                  t == MC_GPT_FC1_W || t == MC_GPT_FC1_B || t == MC_GPT_FC2_W;
        return numel[t];
    }
    if (j - layers == 0) {   /* position embedding (replicated), then the word embedding */
        *normed = r0;
        return M->pm * h;
    }
    *own = tied && M->p > 1, *normed = 1;
    return M->vocab * h / M->t;
}

static long long mc__mem_params_in_chunk(const mc__mem *M, int c) {
    long long n = (long long)M->nl * MC_GPT_LAYER_TENSORS;
    if (M->pre && c == 0) n += 2;
    if (M->post && c == M->v - 1) n += M->out_layer ? 3 : 2;
    return n;
}

/* Params the grad norm sums on this TP rank (§12: not the tied copy; replicas on TP rank 0). */
static double mc__mem_norm_params(const mc__mem *M) {
    double n = 0.0;
    int c;
    for (c = 0; c < M->v; c++) n += (double)mc__mem_params_in_chunk(M, c);
    if (M->post && M->out_layer && !M->cfg.untie_embeddings_and_output_weights) n -= 1.0;
    if (M->tp_rank == 0) return n;
    /* TP rank > 0: the split tensors only (qkv weight and bias, proj weight, fc1 weight and
       bias, fc2 weight; the word embedding; an untied output layer) */
    return 6.0 * M->nl * M->v + (M->pre ? 1.0 : 0.0) +
           (M->post && M->cfg.untie_embeddings_and_output_weights ? 1.0 : 0.0);
}

/* Closes the open bucket at `at`; counts the params of [first, last) that reach into this DP
   rank's shard of it (mc_ddp_shard), by replaying their placement. */
static void mc__mem_close_bucket(mc__mem_layout *L, int c, long long last, double at) {
    double end = mc__mem_round_up(at, L->align), size = end - L->bucket_start;
    double lo = L->bucket_start + (double)L->M->dp_rank * size / L->M->d, hi = lo + size / L->M->d;
    double pos = L->bucket_start;
    long long j;
    int own, normed;
    for (j = L->first; j < last && L->M->dist; j++) {
        double numel = mc__mem_param_at(L->M, c, j, &own, &normed);
        double off = mc__mem_round_up(pos, 64.0);
        if (off < hi && off + numel > lo) L->owned += 1.0, L->owned_normed += normed;
        pos = off + numel;
    }
    L->start = L->bucket_start = end;
    L->in_bucket = 0;
    L->first = last;
}

/* P' (the table total) and the params with a part in this DP rank's shards. Param by param up
   to 2^22 params; beyond, the layers in closed form (each tensor rounded up to 64, no bucket
   closing inside them, every param counted as owned: an upper bound of the span table). */
static double mc__mem_layout_replay(const mc__mem *M, double *owned, double *owned_normed) {
    mc__mem_layout L;
    double numel[MC_GPT_LAYER_TENSORS], layer_padded = 0.0, all = 0.0;
    int c, i, own, normed;
    long long j, n;
    memset(&L, 0, sizeof L);
    L.M = M;
    mc__mem_layer_numel(M, numel);
    for (i = 0; i < MC_GPT_LAYER_TENSORS; i++) layer_padded += mc__mem_round_up(numel[i], 64.0);
    for (c = 0; c < M->v; c++) all += (double)mc__mem_params_in_chunk(M, c);
    L.align = (double)((size_t)M->d / mc__param_gcd((size_t)M->d, MC__PARAM_BUCKET_ALIGN) *
                       MC__PARAM_BUCKET_ALIGN);
    if (all > 4194304.0) {
        for (c = 0; c < M->v; c++) {
            long long head = M->post && c == M->v - 1 ? (M->out_layer ? 3 : 2) : 0;
            long long n_c = mc__mem_params_in_chunk(M, c), tail = M->pre && c == 0 ? 2 : 0;
            double pos = L.start;
            for (j = 0; j < head; j++) pos = mc__mem_round_up(pos, 64.0) + mc__mem_param_at(M, c, j, &own, &normed);
            if (M->nl > 0) pos = mc__mem_round_up(pos, 64.0) + layer_padded * M->nl;
            for (j = n_c - tail; j < n_c; j++)
                pos = mc__mem_round_up(pos, 64.0) + mc__mem_param_at(M, c, j, &own, &normed);
            L.start = mc__mem_round_up(pos, L.align);   /* inner bucket ends left out */
        }
        *owned = all;
        *owned_normed = mc__mem_norm_params(M);
        return L.start;
    }
    for (c = 0; c < M->v; c++) {
        L.bucket_size = (M->r == 0 && c == 0) ? (double)M->bucket_size : 0.0;
        L.bucket_start = L.end = L.start;
        L.in_bucket = 0, L.first = 0;
        for (j = 0, n = mc__mem_params_in_chunk(M, c); j < n; j++) {
            double size = mc__mem_param_at(M, c, j, &own, &normed);
            L.start = mc__mem_round_up(L.start, 64.0);
            if (own && L.in_bucket > 0) mc__mem_close_bucket(&L, c, j, L.start);
            L.end = L.start + size;
            L.in_bucket++;
            if ((L.bucket_size > 0.0 && L.end - L.bucket_start >= L.bucket_size) || own)
                mc__mem_close_bucket(&L, c, j + 1, L.end);
            else
                L.start = L.end;
        }
        if (L.in_bucket > 0) mc__mem_close_bucket(&L, c, n, L.end);
    }
    *owned = L.owned;
    *owned_normed = L.owned_normed;
    return L.start;
}


static void mc__mem_param_terms(const mc__mem *M, const mc_memory_desc *desc, mc_memory_stage *st) {
    double P = st->params, Pp = st->params_padded, d = M->d;
    int dist = desc->distributed_optimizer != 0, bf16 = desc->bf16 != 0;
    double opt_bytes = bf16 ? 12.0 : 8.0;
    mc_memory_term *t;
    /* paper */
    t = mc__mem_term(st, MC_MEMORY_PAPER, MC_MEMORY_PARAMETERS,
                     bf16 ? "weights (bf16)" : "weights (fp32)", (double)M->e * P);
    snprintf(t->formula, sizeof t->formula, "%d" MC__MX "P", M->e);
    snprintf(t->values, sizeof t->values, "%d" MC__MX "%.15g", M->e, P);
    t = mc__mem_term(st, MC_MEMORY_PAPER, MC_MEMORY_GRADIENTS, "grads (fp32)", 4.0 * P);
    snprintf(t->formula, sizeof t->formula, "4" MC__MX "P");
    snprintf(t->values, sizeof t->values, "4" MC__MX "%.15g", P);
    t = mc__mem_term(st, MC_MEMORY_PAPER, MC_MEMORY_OPTIMIZER,
                     bf16 ? "main params, Adam m, v" : "Adam m, v", opt_bytes * P / (dist ? d : 1.0));
    snprintf(t->formula, sizeof t->formula, "%g" MC__MX "P%s", opt_bytes, dist ? "/d" : "");
    snprintf(t->values, sizeof t->values, "%g" MC__MX "%.15g%s%.0f", opt_bytes, P,
             dist ? "/" : "", dist ? d : 0.0);
    if (!dist) t->values[strlen(t->values) - 1] = '\0';   /* drop the "0" */
    /* implementation */
    {
        double state = dist ? Pp / d : Pp, owned = st->owned_params;
        double normed = dist ? st->owned_normed : mc__mem_norm_params(M);
        double span = (double)sizeof(mc_adamw_span), main = M->ea == 2 ? 4.0 : 0.0;
        t = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_PARAMETERS,
                         M->ea == 2 ? "params (bf16)" : "params (fp32)", M->ea * Pp);
        snprintf(t->formula, sizeof t->formula, "%d" MC__MX "P'", M->ea);
        snprintf(t->values, sizeof t->values, "%d" MC__MX "%.15g", M->ea, Pp);
        t = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_GRADIENTS, "grads (fp32)", 4.0 * Pp);
        snprintf(t->formula, sizeof t->formula, "4" MC__MX "P'");
        snprintf(t->values, sizeof t->values, "4" MC__MX "%.15g", Pp);
        t = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_OPTIMIZER,
                         main > 0 ? "main params, Adam m, v" : "Adam m, v (fp32)",
                         (8.0 + main) * state);
        snprintf(t->formula, sizeof t->formula, "%g" MC__MX "P'%s", 8.0 + main, dist ? "/d" : "");
        if (dist) snprintf(t->values, sizeof t->values, "%g" MC__MX "%.15g/%.0f", 8.0 + main, Pp, d);
        else snprintf(t->values, sizeof t->values, "%g" MC__MX "%.15g", 8.0 + main, Pp);
        t = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_OPTIMIZER, "span tables",
                         16.0 * (normed + 1.0) + span * (owned + 1.0) + 8.0);
        snprintf(t->formula, sizeof t->formula, "16" MC__MX "(norm spans + 1) + %.0f" MC__MX
                 "(AdamW spans + 1) + 8 (the norm)", span);
        snprintf(t->values, sizeof t->values, "16" MC__MX "%.0f + %.0f" MC__MX "%.0f + 8",
                 normed + 1.0, span, owned + 1.0);
    }
}

static void mc__mem_param_text(const mc__mem *M, mc_memory_stage *st) {
    char *f = st->params_formula, *v = st->params_values;
    size_t fc = sizeof st->params_formula, vc = sizeof st->params_values, fl, vl;
    snprintf(f, fc, "Ls" MC__MD "((4h + 2F)" MC__MD "h + 3h + F)/t + Ls" MC__MD "6h");
    snprintf(v, vc, "%d" MC__MD "((4" MC__MD "%.0f + 2" MC__MD "%.0f)" MC__MD "%.0f + 3"
             MC__MD "%.0f + %.0f)/%d + %d" MC__MD "6" MC__MD "%.0f",
             M->nl * M->v, M->h, M->f, M->h, M->h, M->f, M->t, M->nl * M->v, M->h);
    fl = strlen(f), vl = strlen(v);
    if (M->pre) {
        snprintf(f + fl, fc - fl, " + V" MC__MD "h/t + Pm" MC__MD "h");
        snprintf(v + vl, vc - vl, " + %.0f" MC__MD "%.0f/%d + %.0f" MC__MD "%.0f", M->vocab,
                 M->h, M->t, M->pm, M->h);
        fl = strlen(f), vl = strlen(v);
    }
    if (M->post) {
        snprintf(f + fl, fc - fl, " + 2h%s", M->out_layer ? " + V" MC__MD "h/t" : "");
        snprintf(v + vl, vc - vl, " + 2" MC__MD "%.0f", M->h);
        vl = strlen(v);
        if (M->out_layer)
            snprintf(v + vl, vc - vl, " + %.0f" MC__MD "%.0f/%d", M->vocab, M->h, M->t);
    }
}

// --- paper activations -----------------------------------------------------------------------

/* Per-chunk layer bookkeeping shared by both models: layers with full caches and recompute
   groups (mc__gpt_plan_recompute's rule). */
static void mc__mem_recompute_counts(const mc__mem *M, int *kept, int *groups, int *interior,
                                     int *max_group) {
    int nl = M->nl, k = M->k < 1 ? 1 : M->k;
    *kept = nl, *groups = 0, *interior = 0, *max_group = 0;
    if (!M->full) return;
    if (M->block) {
        *groups = k < nl ? k : nl;
        *kept = nl - *groups;
        *max_group = *groups > 0 ? 1 : 0;
    } else {
        *groups = (nl + k - 1) / k;
        *kept = 0;
        *interior = nl - *groups;
        *max_group = k < nl ? k : nl;
    }
}

/* Held activation sets per chunk at the stage's peak of paper activation bytes: the op order of
   mc_schedule_ops replayed (a forward adds its chunk's set, a backward removes one). Up to
   2^22 ops; beyond, the moment the warmup ends (which is the peak for 1F1B). */
static void mc__mem_in_flight(const mc__sched *s, const double *chunk_bytes, int *held_out) {
    int total = mc__sched_total(s), warmup = mc__sched_warmup(s), remaining = total - warmup;
    int held[MC_MAX_VPP], c, k, mb, chunk;
    double best = -1.0;
    memset(held, 0, sizeof held);
    memset(held_out, 0, sizeof(int) * MC_MAX_VPP);
#define MC__MEM_SNAPSHOT()                                                            \
    do {                                                                              \
        double now_ = 0.0;                                                            \
        for (c = 0; c < s->v; c++) now_ += held[c] * chunk_bytes[c];                  \
        if (now_ > best) best = now_, memcpy(held_out, held, sizeof held);            \
    } while (0)
#define MC__MEM_FORWARD(kk)                                                           \
    do {                                                                              \
        mb = (kk), chunk = 0;                                                         \
        if (s->interleaved) mc__sched_table_entry(s, (kk), &mb, &chunk);              \
        held[chunk]++;                                                                \
        MC__MEM_SNAPSHOT();                                                           \
    } while (0)
#define MC__MEM_BACKWARD(kk)                                                          \
    do {                                                                              \
        mb = (kk), chunk = 0;                                                         \
        if (s->interleaved) mc__sched_table_entry(s, (kk), &mb, &chunk);              \
        held[s->v - 1 - chunk]--;                                                     \
    } while (0)
    if ((double)total * 2.0 > 4194304.0) {
        int upto = warmup < total ? warmup + 1 : total;
        for (k = 0; k < upto; k++) MC__MEM_FORWARD(k);
    } else {
        for (k = 0; k < warmup; k++) MC__MEM_FORWARD(k);
        for (k = 0; k < remaining; k++) {
            MC__MEM_FORWARD(warmup + k);
            MC__MEM_BACKWARD(k);
        }
    }
#undef MC__MEM_FORWARD
#undef MC__MEM_BACKWARD
#undef MC__MEM_SNAPSHOT
    (void)mb;
}

static void mc__mem_paper_activations(const mc__mem *M, const mc__sched *sched,
                                      mc_memory_stage *st) {
    double e = M->e, sbh = M->s * M->b * M->h, t = M->t, f = M->f / M->h;
    double c_rep = 4.0 * e + 2.0, c_split = 4.0 * e + 2.0 * e * f, c_all = c_rep + c_split;
    double c_att = 2.0 * e + 1.0, att = c_att * M->a * M->s * M->s * M->b;
    double per_layer, rec_input, emb, out, chunk_bytes[MC_MAX_VPP];
    int kept, groups, interior, max_group, held[MC_MAX_VPP], c, k_total = 0;
    int last = M->v - 1;
    char layers_sym[32], layers_val[32], f_sym[96], f_val[160];
    mc_memory_term *term;
    mc__mem_recompute_counts(M, &kept, &groups, &interior, &max_group);
    (void)interior, (void)max_group;
    /* one layer's activations of one micro-batch */
    if (M->sp)
        per_layer = (c_all * sbh + (M->selective ? 0.0 : att)) / t;
    else
        per_layer = c_rep * sbh + c_split * sbh / t + (M->selective ? 0.0 : att / t);
    rec_input = e * sbh / (M->sp ? t : 1.0);
    emb = 8.0 * M->s * M->b + M->s * M->b * M->h / (M->sp ? t : 1.0);
    out = 2.0 * e * sbh / (M->sp ? t : 1.0) + 4.0 * M->s * M->b * M->vocab / t;
    for (c = 0; c < M->v; c++) {
        chunk_bytes[c] = per_layer * kept + rec_input * groups;
        if (c == 0 && M->pre) chunk_bytes[c] += emb;
        if (c == last && M->post) chunk_bytes[c] += out;
    }
    mc__mem_in_flight(sched, chunk_bytes, held);
    for (c = 0; c < M->v; c++) k_total += held[c];
    st->in_flight = k_total;
    /* the in-flight line */
    if (M->p == 1) {
        snprintf(st->in_flight_formula, sizeof st->in_flight_formula, "1 (no pipelining)");
        snprintf(st->in_flight_values, sizeof st->in_flight_values, "1");
    } else if (M->v == 1) {
        snprintf(st->in_flight_formula, sizeof st->in_flight_formula, "min(p - r, M) (1F1B)");
        snprintf(st->in_flight_values, sizeof st->in_flight_values, "min(%d - %d, %d) = %d",
                 M->p, M->r, M->m, k_total);
    } else {
        size_t n;
        snprintf(st->in_flight_formula, sizeof st->in_flight_formula,
                 "k = min(2" MC__MD "(p - r - 1) + (v - 1)" MC__MD "p + 1, M" MC__MD
                 "v) chunk micro-batches (interleaved)");
        snprintf(st->in_flight_values, sizeof st->in_flight_values,
                 "min(2" MC__MD "(%d - %d - 1) + (%d - 1)" MC__MD "%d + 1, %d" MC__MD "%d) = %d:",
                 M->p, M->r, M->v, M->p, M->m, M->v, k_total);
        for (c = 0; c < M->v; c++) {
            n = strlen(st->in_flight_values);
            snprintf(st->in_flight_values + n, sizeof st->in_flight_values - n,
                     "%s chunk %d holds %d", c ? "," : "", c, held[c]);
        }
    }
    /* layer count symbol: per chunk, times the in-flight chunk micro-batches */
    if (M->v > 1)
        snprintf(layers_sym, sizeof layers_sym, "L/(p" MC__MD "v)");
    else
        snprintf(layers_sym, sizeof layers_sym, "L/p");
    snprintf(layers_val, sizeof layers_val, "%d", M->nl);
    if (M->full && M->block && kept > 0) {
        size_t n = strlen(layers_sym);
        snprintf(layers_sym + n, sizeof layers_sym - n, " - n");
        snprintf(layers_val, sizeof layers_val, "(%d - %d)", M->nl, groups);
    }
    if (kept > 0) {
        /* Korthikanti Table 2 with this precision's coefficients */
        if (M->sp && M->selective)
            snprintf(f_sym, sizeof f_sym, "%g" MC__MD "s" MC__MD "b" MC__MD "h/t", c_all);
        else if (M->sp)
            snprintf(f_sym, sizeof f_sym, "s" MC__MD "b" MC__MD "h" MC__MD "(%g + %g" MC__MD "a"
                     MC__MD "s/h)/t", c_all, c_att);
        else if (M->t == 1 && M->selective)
            snprintf(f_sym, sizeof f_sym, "%g" MC__MD "s" MC__MD "b" MC__MD "h", c_all);
        else if (M->t == 1)
            snprintf(f_sym, sizeof f_sym, "s" MC__MD "b" MC__MD "h" MC__MD "(%g + %g" MC__MD "a"
                     MC__MD "s/h)", c_all, c_att);
        else if (M->selective)
            snprintf(f_sym, sizeof f_sym, "s" MC__MD "b" MC__MD "h" MC__MD "(%g + %g/t)", c_rep,
                     c_split);
        else
            snprintf(f_sym, sizeof f_sym, "s" MC__MD "b" MC__MD "h" MC__MD "(%g + %g/t + %g" MC__MD
                     "a" MC__MD "s/(h" MC__MD "t))", c_rep, c_split, c_att);
        if (M->sp && M->selective)
            snprintf(f_val, sizeof f_val, "%g" MC__MD "%.0f" MC__MD "%.0f" MC__MD "%.0f/%d", c_all,
                     M->s, M->b, M->h, M->t);
        else if (M->sp)
            snprintf(f_val, sizeof f_val, "%.0f" MC__MD "%.0f" MC__MD "%.0f" MC__MD "(%g + %g"
                     MC__MD "%.0f" MC__MD "%.0f/%.0f)/%d", M->s, M->b, M->h, c_all, c_att, M->a,
                     M->s, M->h, M->t);
        else if (M->t == 1 && M->selective)
            snprintf(f_val, sizeof f_val, "%g" MC__MD "%.0f" MC__MD "%.0f" MC__MD "%.0f", c_all,
                     M->s, M->b, M->h);
        else if (M->t == 1)
            snprintf(f_val, sizeof f_val, "%.0f" MC__MD "%.0f" MC__MD "%.0f" MC__MD "(%g + %g"
                     MC__MD "%.0f" MC__MD "%.0f/%.0f)", M->s, M->b, M->h, c_all, c_att, M->a,
                     M->s, M->h);
        else if (M->selective)
            snprintf(f_val, sizeof f_val, "%.0f" MC__MD "%.0f" MC__MD "%.0f" MC__MD "(%g + %g/%d)",
                     M->s, M->b, M->h, c_rep, c_split, M->t);
        else
            snprintf(f_val, sizeof f_val, "%.0f" MC__MD "%.0f" MC__MD "%.0f" MC__MD "(%g + %g/%d + %g"
                     MC__MD "%.0f" MC__MD "%.0f/(%.0f" MC__MD "%d))", M->s, M->b, M->h, c_rep,
                     c_split, M->t, c_att, M->a, M->s, M->h, M->t);
        term = mc__mem_term(st, MC_MEMORY_PAPER, MC_MEMORY_ACTIVATIONS, "transformer layers",
                            per_layer * kept * k_total);
        snprintf(term->formula, sizeof term->formula, "%s" MC__MX "%s" MC__MX "%s", f_sym,
                 layers_sym, M->v > 1 ? "k" : M->p > 1 ? "min(p - r, M)" : "1");
        snprintf(term->values, sizeof term->values, "%s" MC__MX "%s" MC__MX "%d", f_val,
                 layers_val, k_total);
    }
    if (groups > 0) {
        term = mc__mem_term(st, MC_MEMORY_PAPER, MC_MEMORY_ACTIVATIONS,
                            M->block ? "recomputed layers' inputs" : "recompute group inputs",
                            rec_input * groups * k_total);
        snprintf(term->formula, sizeof term->formula, "%g" MC__MD "s" MC__MD "b" MC__MD "h%s"
                 MC__MX "%s" MC__MX "%s", e, M->sp ? "/t" : "",
                 M->block ? "n" : "ceil(L/(p" MC__MD "v" MC__MD "n))",
                 M->v > 1 ? "k" : M->p > 1 ? "min(p - r, M)" : "1");
        if (M->sp)
            snprintf(term->values, sizeof term->values, "%g" MC__MD "%.0f" MC__MD "%.0f" MC__MD
                     "%.0f/%d" MC__MX "%d" MC__MX "%d", e, M->s, M->b, M->h, M->t, groups, k_total);
        else
            snprintf(term->values, sizeof term->values, "%g" MC__MD "%.0f" MC__MD "%.0f" MC__MD
                     "%.0f" MC__MX "%d" MC__MX "%d", e, M->s, M->b, M->h, groups, k_total);
    }
    if (M->pre) {
        term = mc__mem_term(st, MC_MEMORY_PAPER, MC_MEMORY_ACTIVATIONS,
                            "embedding ids, dropout mask", emb * held[0]);
        snprintf(term->formula, sizeof term->formula, "(8" MC__MD "s" MC__MD "b + s" MC__MD "b"
                 MC__MD "h%s)" MC__MX "%s", M->sp ? "/t" : "",
                 M->v > 1 ? "k(chunk 0)" : M->p > 1 ? "min(p - r, M)" : "1");
        snprintf(term->values, sizeof term->values, "(8" MC__MD "%.0f" MC__MD "%.0f + %.0f" MC__MD
                 "%.0f" MC__MD "%.0f%s%.0f)" MC__MX "%d", M->s, M->b, M->s, M->b, M->h,
                 M->sp ? "/" : "", M->sp ? t : 0.0, held[0]);
        if (!M->sp) {   /* drop the "0" printed for the missing divisor */
            char *z = strstr(term->values, "0)");
            if (z) memmove(z, z + 1, strlen(z + 1) + 1);
        }
    }
    if (M->post) {
        term = mc__mem_term(st, MC_MEMORY_PAPER, MC_MEMORY_ACTIVATIONS,
                            "final norm, output layer, logits", out * held[last]);
        snprintf(term->formula, sizeof term->formula, "(%g" MC__MD "s" MC__MD "b" MC__MD "h%s + 4"
                 MC__MD "s" MC__MD "b" MC__MD "V/t)" MC__MX "%s", 2.0 * e, M->sp ? "/t" : "",
                 M->v > 1 ? "k(last chunk)" : M->p > 1 ? "min(p - r, M)" : "1");
        if (M->sp)
            snprintf(term->values, sizeof term->values, "(%g" MC__MD "%.0f" MC__MD "%.0f" MC__MD
                     "%.0f/%d + 4" MC__MD "%.0f" MC__MD "%.0f" MC__MD "%.0f/%d)" MC__MX "%d",
                     2.0 * e, M->s, M->b, M->h, M->t, M->s, M->b, M->vocab, M->t, held[last]);
        else
            snprintf(term->values, sizeof term->values, "(%g" MC__MD "%.0f" MC__MD "%.0f" MC__MD
                     "%.0f + 4" MC__MD "%.0f" MC__MD "%.0f" MC__MD "%.0f/%d)" MC__MX "%d",
                     2.0 * e, M->s, M->b, M->h, M->s, M->b, M->vocab, M->t, held[last]);
    }
    term = mc__mem_term(st, MC_MEMORY_PAPER, MC_MEMORY_COMMUNICATION, "P2P (in the layer inputs)",
                        0.0);
    snprintf(term->formula, sizeof term->formula, "0: a received activation is the saved input");
    snprintf(term->values, sizeof term->values, "0");
}

// --- implementation activations --------------------------------------------------------------

/* An activation arena (mc__arena_take): every tensor starts at a multiple of 256 bytes and
   takes at least 1 byte. `rounded` adds up the rounded sizes, `pad` is the padding after the
   last tensor, which the arena does not take; raw is what the tensors themselves need. */
typedef struct mc__mem_arena {
    double rounded, pad, raw;
} mc__mem_arena;

static void mc__mem_take(mc__mem_arena *ar, double bytes) {
    double r;
    if (bytes < 1.0) bytes = 1.0;
    r = mc__mem_round_up(bytes, 256.0);
    ar->rounded += r, ar->pad = r - bytes, ar->raw += bytes;
}

/* `times` copies of the tensors of `part` */
static void mc__mem_take_all(mc__mem_arena *ar, const mc__mem_arena *part, double times) {
    if (times <= 0.0) return;
    ar->rounded += part->rounded * times, ar->pad = part->pad, ar->raw += part->raw * times;
}

static double mc__mem_arena_bytes(const mc__mem_arena *ar) { return ar->rounded - ar->pad; }

/* One layer cache (mc__gpt_point_cache): raw bytes and its rounded run of tensors. */
static mc__mem_arena mc__mem_cache(const mc__mem *M, int keep_stats) {
    double n = M->n, ns = M->ns, h = M->h, ql = h / M->t, fl = M->f / M->t, e = M->ea;
    mc__mem_arena c;
    memset(&c, 0, sizeof c);
    mc__mem_take(&c, e * ns * h);
    mc__mem_take(&c, 4.0 * ns), mc__mem_take(&c, 4.0 * ns);
    mc__mem_take(&c, e * n * 3.0 * ql), mc__mem_take(&c, e * n * ql);
    if (keep_stats) mc__mem_take(&c, 4.0 * M->stats);
    mc__mem_take(&c, e * ns * h), mc__mem_take(&c, e * ns * h);
    mc__mem_take(&c, 4.0 * ns), mc__mem_take(&c, 4.0 * ns);
    mc__mem_take(&c, e * n * fl), mc__mem_take(&c, e * n * fl);
    return c;
}

/* mc__gpt_tp_scratch_bytes */
static double mc__mem_tp_scratch(const mc__mem *M) {
    int f = M->sp ? MC_TP_SEQUENCE_PARALLEL : 0, fr = f | MC_TP_INPUT_IS_PARALLEL;
    int S = (int)M->s, B = (int)M->b, H = (int)M->h, F = (int)M->f, V = (int)M->vocab;
    size_t need = 0, n;
#define MC__MEM_NEED(x) n = (x); if (n > need) need = n
    MC__MEM_NEED(mc_column_parallel_linear_scratch(S, B, H, 3 * H, f, M->t));
    MC__MEM_NEED(mc_column_parallel_linear_scratch(S, B, H, F, f, M->t));
    MC__MEM_NEED(mc_column_parallel_linear_scratch(S, B, H, V, f, M->t));
    MC__MEM_NEED(mc_row_parallel_linear_scratch(S, B, H, H, fr, M->t));
    MC__MEM_NEED(mc_row_parallel_linear_scratch(S, B, F, H, fr, M->t));
    need *= (size_t)M->ea;
    MC__MEM_NEED(sizeof(float) * mc_vocab_parallel_cross_entropy_scratch(S * B, V, 0.0f, M->t));
#undef MC__MEM_NEED
    return (double)need;
}

static void mc__mem_impl_activations(const mc__mem *M, mc_memory_stage *st) {
    double n = M->n, ns = M->ns, h = M->h, ql = h / M->t, fl = M->f / M->t, vl = M->vocab / M->t;
    double e = M->ea, slots = M->slots, raw, exact = 0.0, raw_sum = 0.0;
    double tp_scratch = mc__mem_tp_scratch(M);
    mc__mem_arena cache = mc__mem_cache(M, M->keep_stats), replay = mc__mem_cache(M, 1), ar;
    int kept, groups, interior, max_group, n_res, c, l;
    const char *ns_sym = M->sp ? "s" MC__MD "b/t" : "s" MC__MD "b";
    char ns_val[32], v_val[16] = "", e_sym[8];
    mc_memory_term *term;
    mc__mem_recompute_counts(M, &kept, &groups, &interior, &max_group);
    if (M->v > 1) snprintf(v_val, sizeof v_val, "%d" MC__MX, M->v);
    if (M->sp) snprintf(ns_val, sizeof ns_val, "(%.0f" MC__MD "%.0f/%d)", M->s, M->b, M->t);
    else snprintf(ns_val, sizeof ns_val, "%.0f" MC__MD "%.0f", M->s, M->b);
    snprintf(e_sym, sizeof e_sym, "%d", M->ea);
    st->n_slots = M->slots;
    n_res = M->nl + 1 - interior;
    /* the arenas, exactly: v x slots slot arenas and one scratch arena */
    for (c = 0; c < M->v; c++) {
        memset(&ar, 0, sizeof ar);
        mc__mem_take(&ar, e * ns * h);                               /* input grad */
        for (l = 0; l < n_res; l++) mc__mem_take(&ar, e * ns * h);   /* layer inputs, output */
        mc__mem_take_all(&ar, &cache, kept);
        if (M->pre && c == 0) mc__mem_take(&ar, 4.0 * n);
        if (M->post && c == M->v - 1) {
            mc__mem_take(&ar, 4.0 * n), mc__mem_take(&ar, e * ns * h);
            mc__mem_take(&ar, 4.0 * ns), mc__mem_take(&ar, 4.0 * ns);
            mc__mem_take(&ar, e * n * vl);
            for (l = 0; l < 3; l++) mc__mem_take(&ar, 4.0 * n);
            mc__mem_take(&ar, 8.0);
        }
        exact += mc__mem_arena_bytes(&ar) * slots;
    }
    memset(&ar, 0, sizeof ar);
    for (l = 0; l < max_group; l++) {
        mc__mem_take_all(&ar, &replay, 1.0);
        if (l > 0) mc__mem_take(&ar, e * ns * h);
    }
    if (M->selective) mc__mem_take(&ar, 4.0 * M->stats), mc__mem_take(&ar, e * n * ql);
    mc__mem_take(&ar, e * n * h), mc__mem_take(&ar, e * n * h);
    for (l = 0; l < 6; l++) mc__mem_take(&ar, e * ns * h);
    mc__mem_take(&ar, e * n * 3.0 * ql), mc__mem_take(&ar, e * n * ql);
    mc__mem_take(&ar, e * n * fl), mc__mem_take(&ar, e * n * fl);
    mc__mem_take(&ar, 4.0 * n), mc__mem_take(&ar, tp_scratch), mc__mem_take(&ar, 4.0 * n);
    if (M->post) mc__mem_take(&ar, e * n * vl);
    exact += mc__mem_arena_bytes(&ar);
    /* the terms: what the tensors need; the alignment padding last */
    if (kept > 0) {
        raw = cache.raw * kept * M->v * slots;
        raw_sum += raw;
        term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_ACTIVATIONS, "layer caches", raw);
        snprintf(term->formula, sizeof term->formula, "(e" MC__MD "(3" MC__MD "Ns" MC__MD "h + 4"
                 MC__MD "s" MC__MD "b" MC__MD "h/t + 2" MC__MD "s" MC__MD "b" MC__MD "F/t) + 4"
                 MC__MD "(4" MC__MD "Ns%s))" MC__MX "%s" MC__MX "%sslots (Ns = %s)",
                 M->keep_stats ? " + attention stats" : "",
                 M->full ? "kept layers" : M->v > 1 ? "L/(p" MC__MD "v)" : "L/p",
                 M->v > 1 ? "v" MC__MX : "", ns_sym);
        snprintf(term->values, sizeof term->values, "(%s" MC__MD "(3" MC__MD "%.15g" MC__MD "%.0f + 4"
                 MC__MD "%.0f" MC__MD "%.15g + 2" MC__MD "%.0f" MC__MD "%.15g) + 4" MC__MD "(4"
                 MC__MD "%.15g%s%.15g))" MC__MX "%d" MC__MX "%s%d", e_sym, ns, h, n, ql, n, fl, ns,
                 M->keep_stats ? " + " : "", M->keep_stats ? M->stats : 0.0, kept, v_val,
                 M->slots);
        if (!M->keep_stats) {   /* drop the "0" of the missing stats term */
            char *z = strstr(term->values, "0))");
            if (z) memmove(z, z + 1, strlen(z + 1) + 1);
        }
    }
    raw = e * ns * h * (n_res + 1) * M->v * slots;
    raw_sum += raw;
    term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_ACTIVATIONS,
                        "layer inputs, input grad", raw);
    snprintf(term->formula, sizeof term->formula, "e" MC__MD "Ns" MC__MD "h" MC__MX "(%s + 2)"
             MC__MX "%sslots", M->full && !M->block ? "groups" : M->v > 1 ? "L/(p" MC__MD "v)" : "L/p",
             M->v > 1 ? "v" MC__MX : "");
    snprintf(term->values, sizeof term->values, "%s" MC__MD "%s" MC__MD "%.0f" MC__MX "(%d + 2)"
             MC__MX "%s%d", e_sym, ns_val, h, n_res - 1, v_val, M->slots);
    if (M->pre) {
        raw = 4.0 * n * slots;
        raw_sum += raw;
        term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_ACTIVATIONS, "token ids", raw);
        snprintf(term->formula, sizeof term->formula, "4" MC__MD "s" MC__MD "b" MC__MX "slots");
        snprintf(term->values, sizeof term->values, "4" MC__MD "%.0f" MC__MD "%.0f" MC__MX "%d",
                 M->s, M->b, M->slots);
    }
    if (M->post) {
        raw = (e * (n * vl + ns * h) + 4.0 * (2.0 * ns + 4.0 * n) + 8.0) * slots;
        raw_sum += raw;
        term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_ACTIVATIONS,
                            "final norm, logits, loss", raw);
        snprintf(term->formula, sizeof term->formula, "(e" MC__MD "(s" MC__MD "b" MC__MD "V/t + Ns"
                 MC__MD "h) + 4" MC__MD "(2" MC__MD "Ns + 4" MC__MD "s" MC__MD "b) + 8)" MC__MX
                 "slots");
        snprintf(term->values, sizeof term->values, "(%s" MC__MD "(%.0f" MC__MD "%.0f" MC__MD
                 "%.0f/%d + %.15g" MC__MD "%.0f) + 4" MC__MD "(2" MC__MD "%.15g + 4" MC__MD "%.0f"
                 MC__MD "%.0f) + 8)" MC__MX "%d", e_sym, M->s, M->b, M->vocab, M->t, ns, h, ns,
                 M->s, M->b, M->slots);
    }
    /* once per rank: the scratch arena */
    raw = e * (2.0 * n * h + 6.0 * ns * h + 4.0 * n * ql + 2.0 * n * fl + (M->post ? n * vl : 0.0)) +
          8.0 * n;
    raw_sum += raw;
    term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_ACTIVATIONS, "backward workspace",
                        raw);
    snprintf(term->formula, sizeof term->formula, "e" MC__MD "(2" MC__MD "s" MC__MD "b" MC__MD
             "h + 6" MC__MD "Ns" MC__MD "h + 4" MC__MD "s" MC__MD "b" MC__MD "h/t + 2" MC__MD "s"
             MC__MD "b" MC__MD "F/t%s) + 8" MC__MD "s" MC__MD "b",
             M->post ? " + s" MC__MD "b" MC__MD "V/t" : "");
    snprintf(term->values, sizeof term->values, "%s" MC__MD "(2" MC__MD "%.0f" MC__MD "%.0f + 6"
             MC__MD "%.15g" MC__MD "%.0f + 4" MC__MD "%.0f" MC__MD "%.15g + 2" MC__MD "%.0f" MC__MD
             "%.15g%s%.15g) + 8" MC__MD "%.0f", e_sym, n, h, ns, h, n, ql, n, fl,
             M->post ? " + " : "", M->post ? n * vl : 0.0, n);
    if (!M->post) {
        char *z = strstr(term->values, "0) + 8");
        if (z) memmove(z, z + 1, strlen(z + 1) + 1);
    }
    raw_sum += tp_scratch < 1.0 ? 1.0 : tp_scratch;
    term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_ACTIVATIONS, "TP scratch",
                        tp_scratch < 1.0 ? 1.0 : tp_scratch);
    snprintf(term->formula, sizeof term->formula, "the largest scratch of the TP layers");
    snprintf(term->values, sizeof term->values, "%.15g", tp_scratch);
    if (M->selective) {
        raw = 4.0 * M->stats + e * n * ql;
        raw_sum += raw;
        term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_ACTIVATIONS,
                            "selective recompute scratch", raw);
        snprintf(term->formula, sizeof term->formula, "4" MC__MD "attention stats + e" MC__MD "s"
                 MC__MD "b" MC__MD "h/t");
        snprintf(term->values, sizeof term->values, "4" MC__MD "%.15g + %s" MC__MD "%.15g",
                 M->stats, e_sym, n * ql);
    } else if (max_group > 0) {
        raw = replay.raw * max_group + e * ns * h * (max_group - 1);
        raw_sum += raw;
        term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_ACTIVATIONS,
                            "recompute replay caches", raw);
        snprintf(term->formula, sizeof term->formula, "(layer cache with stats)" MC__MX "n + e"
                 MC__MD "Ns" MC__MD "h" MC__MX "(n - 1), n = largest group");
        snprintf(term->values, sizeof term->values, "%.15g" MC__MX "%d + %s" MC__MD "%s" MC__MD
                 "%.0f" MC__MX "%d", replay.raw, max_group, e_sym, ns_val, h, max_group - 1);
    }
    term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_ACTIVATIONS,
                        "arena alignment", exact - raw_sum);
    snprintf(term->formula, sizeof term->formula, "each tensor starts at a multiple of 256 bytes "
             "(%d arenas)", M->v * M->slots + 1);
    snprintf(term->values, sizeof term->values, "%.15g - %.15g", exact, raw_sum);
}

// --- implementation communication ------------------------------------------------------------

/* The executor's receive decision (mc__pipe_recv_chunk) on the schedule table alone: the chunk
   whose tensor arrives in the exchange after virtual micro-batch k, or -1. */
static int mc__mem_recv_chunk(const mc__sched *s, int k, int forward) {
    int leading = forward ? s->rank == 0 : s->rank == s->pp - 1;
    int edge = forward ? s->v - 1 : 0, step = forward ? 1 : -1, mb, c, kk;
    if (!leading) kk = k + 1;
    else if (k < s->pp - 1) return -1;
    else kk = k - (s->pp - 1);
    mc__sched_table_entry(s, kk % mc__sched_total(s), &mb, &c);
    if (!forward) c = s->v - 1 - c;
    if (!leading) return c;
    return c == edge ? -1 : c + step;
}

/* Receive buffers held at once at the peak: the P2P calls of the schedule executors replayed
   (a receive takes a buffer, a backward gives back its input and its output grad). */
static int mc__mem_p2p_peak(const mc__sched *s) {
    int total = mc__sched_total(s), w = mc__sched_warmup(s), remaining = total - w;
    int first = s->rank == 0, last = s->rank == s->pp - 1, held = 0, peak = 0, k, mb, c;
#define MC__MEM_RECV(cond) do { if (cond) held++; if (held > peak) peak = held; } while (0)
#define MC__MEM_RELEASE(chunk)                                                           \
    do {                                                                                 \
        held -= !(first && (chunk) == 0);              /* its input */                   \
        held -= !(last && (chunk) == s->v - 1);        /* its output grad */             \
    } while (0)
    if (s->pp == 1) return 0;
    if (!s->interleaved) {
        for (k = 0; k < w; k++) MC__MEM_RECV(!first);
        if (remaining > 0) MC__MEM_RECV(!first);
        for (k = 0; k < remaining; k++) {
            MC__MEM_RECV(!last);                  /* send_forward_recv_backward */
            MC__MEM_RELEASE(0);
            if (k < remaining - 1) MC__MEM_RECV(!first);   /* send_backward_recv_forward */
        }
        for (k = 0; k < w; k++) {
            MC__MEM_RECV(!last);
            MC__MEM_RELEASE(0);
        }
        return peak;
    }
    MC__MEM_RECV(!first);
    for (k = 0; k < w; k++) {
        int prev = k == total - 1 ? -1 : mc__mem_recv_chunk(s, k, 1);
        int next = (k == w - 1 && remaining > 0 && !last) ? s->v - 1 : -1;
        held += (prev >= 0) + (next >= 0);
        if (held > peak) peak = held;
    }
    for (k = 0; k < remaining; k++) {
        int prev = k == remaining - 1 ? -1 : mc__mem_recv_chunk(s, k + w, 1);
        int next = mc__mem_recv_chunk(s, k, 0);
        mc__sched_table_entry(s, k, &mb, &c);
        MC__MEM_RELEASE(s->v - 1 - c);
        held += (prev >= 0) + (next >= 0);
        if (held > peak) peak = held;
    }
    if (remaining == 0) MC__MEM_RECV(!last);
    for (k = remaining; k < total; k++) {
        int next = k == total - 1 ? -1 : mc__mem_recv_chunk(s, k, 0);
        mc__sched_table_entry(s, k, &mb, &c);
        MC__MEM_RELEASE(s->v - 1 - c);
        MC__MEM_RECV(next >= 0);
    }
#undef MC__MEM_RECV
#undef MC__MEM_RELEASE
    return peak;
}

static void mc__mem_impl_communication(const mc__mem *M, const mc__sched *sched,
                                       mc_memory_stage *st) {
    double elems = M->ns * M->h;
    mc_memory_term *term;
    st->p2p_buffers = mc__mem_p2p_peak(sched);
    if (st->p2p_buffers > 0) {
        term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_COMMUNICATION,
                            "P2P receive buffers", M->ea * elems * st->p2p_buffers);
        snprintf(term->formula, sizeof term->formula, "e" MC__MD "Ns" MC__MD "h" MC__MX
                 "buffers held at the peak");
        snprintf(term->values, sizeof term->values, "%d" MC__MD "%.15g" MC__MD "%.0f" MC__MX "%d",
                 M->ea, M->ns, M->h, st->p2p_buffers);
    }
    if (M->sp && M->t > 1) {
        double flagged = 6.0 * M->h * M->nl * M->v + (M->post ? 2.0 * M->h : 0.0);
        term = mc__mem_term(st, MC_MEMORY_IMPLEMENTATION, MC_MEMORY_COMMUNICATION,
                            "packed SP grads (finalize)", 4.0 * flagged);
        snprintf(term->formula, sizeof term->formula, "4" MC__MD "(6h" MC__MD "L/p%s)",
                 M->post ? " + 2h" : "");
        if (M->post)
            snprintf(term->values, sizeof term->values, "4" MC__MD "(6" MC__MD "%.0f" MC__MD
                     "%d + 2" MC__MD "%.0f)", M->h, M->nl * M->v, M->h);
        else
            snprintf(term->values, sizeof term->values, "4" MC__MD "(6" MC__MD "%.0f" MC__MD "%d)",
                     M->h, M->nl * M->v);
    }
}

// --- the estimate ----------------------------------------------------------------------------

static int mc__mem_resolve(const mc_memory_desc *desc, int pp_rank, mc__mem *M, mc__sched *sched) {
    char report[2048];
    mc_schedule_desc sd;
    int violations, rc;
    memset(M, 0, sizeof *M);
    if ((rc = mc_gpt_config_resolve(&M->cfg, &desc->config)) != MC_OK) return rc;
    report[0] = '\0';
    violations = mc_gpt_config_validate(&M->cfg, report, sizeof report);
    if (violations < 0) return violations;
    if (violations > 0)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_memory_estimate: the config breaks %d rule(s):\n%s",
                        violations, report);
    M->d = MC__DEF(desc->data_parallel_size, 1);
    M->m = MC__DEF(desc->num_microbatches, 1);
    M->slots = desc->n_slots;
    if (M->d < 1 || M->m < 1 || M->slots < 0)
        return MC__FAIL(MC_ERR_INVALID_DESC, "mc_memory_desc: data_parallel_size (%d), "
                        "num_microbatches (%d) and n_slots (%d) must be >= 1",
                        desc->data_parallel_size, desc->num_microbatches, desc->n_slots);
    M->t = M->cfg.tensor_model_parallel_size;
    M->p = M->cfg.pipeline_model_parallel_size;
    M->v = M->cfg.virtual_pipeline_model_parallel_size > 1
               ? M->cfg.virtual_pipeline_model_parallel_size : 1;
    if (pp_rank < 0 || pp_rank >= M->p)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_memory_estimate: pp_rank (%d) must be in [0, %d)",
                        pp_rank, M->p);
    memset(&sd, 0, sizeof sd);
    sd.pp = M->p, sd.pp_rank = pp_rank, sd.num_microbatches = M->m;
    sd.vpp = M->v > 1 ? M->v : 0;
    if ((rc = mc__sched_resolve(&sd, sched)) != MC_OK) return rc;
    if (M->slots == 0) M->slots = mc_schedule_max_in_flight(&sd, NULL);
    M->r = pp_rank;
    M->nl = M->cfg.num_layers / (M->p * M->v);
    M->sp = M->cfg.sequence_parallel && M->t > 1;
    M->e = desc->bf16 ? 2 : 4;
    M->pre = pp_rank == 0;
    M->post = pp_rank == M->p - 1;
    M->out_layer = M->cfg.untie_embeddings_and_output_weights || M->p > 1;
    M->selective = M->cfg.recompute_granularity == MC_RECOMPUTE_SELECTIVE;
    M->full = M->cfg.recompute_granularity == MC_RECOMPUTE_FULL;
    M->block = M->cfg.recompute_method == MC_RECOMPUTE_BLOCK;
    M->k = M->cfg.recompute_num_layers;
    M->s = M->cfg.seq_length, M->b = M->cfg.micro_batch_size, M->h = M->cfg.hidden_size;
    M->a = M->cfg.num_attention_heads, M->f = M->cfg.ffn_hidden_size;
    M->vocab = M->cfg.padded_vocab_size, M->pm = M->cfg.max_position_embeddings;
    M->n = M->s * M->b;
    M->ns = M->sp ? M->n / M->t : M->n;
    M->ea = M->e;   /* the implementation stores what the paper does: bf16 or fp32 */
    M->dist = desc->distributed_optimizer != 0;
    M->bucket_size = desc->bucket_size;
    M->ops = desc->ops ? desc->ops : mc_ops_cpu();
    M->tp_rank = desc->tp_rank, M->dp_rank = desc->dp_rank;
    if (M->tp_rank < 0 || M->tp_rank >= M->t || M->dp_rank < 0 || M->dp_rank >= M->d)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_memory_desc: tp_rank (%d) must be in [0, %d) and "
                        "dp_rank (%d) in [0, %d)", M->tp_rank, M->t, M->dp_rank, M->d);
    M->stats = (double)M->ops->attention_stats(M->ops, M->cfg.seq_length, M->cfg.micro_batch_size,
                                               M->cfg.num_attention_heads / M->t,
                                               M->cfg.kv_channels);
    /* as mc_gpt: selective recompute drops the stats unless they are smaller than the
       probabilities (a flash attention's row statistics are kept) */
    M->keep_stats = !M->selective || M->stats < M->b * (M->a / M->t) * M->s * M->s;
    return MC_OK;
}

MC_API int mc_memory_estimate(const mc_memory_desc *desc, int pp_rank, mc_memory_stage *out) {
    mc__mem M;
    mc__sched sched;
    int rc;
    if (!desc || !out)
        return MC__FAIL(MC_ERR_INVALID_ARG, "mc_memory_estimate: desc and out must be set");
    if ((rc = mc__mem_resolve(desc, pp_rank, &M, &sched)) != MC_OK) return rc;
    memset(out, 0, sizeof *out);
    out->pp_rank = pp_rank, out->pp = M.p, out->ranks = M.t * M.d;
    out->layers = M.nl * M.v, out->chunks = M.v;
    out->embedding = M.pre, out->output_layer = M.post;
    out->params = mc__mem_params(&M);
    out->params_padded = mc__mem_layout_replay(&M, &out->owned_params, &out->owned_normed);
    if (!M.dist) {   /* no padding, every param owned */
        int c;
        out->params_padded = out->params, out->owned_params = 0.0;
        for (c = 0; c < M.v; c++) out->owned_params += (double)mc__mem_params_in_chunk(&M, c);
    }
    mc__mem_param_text(&M, out);
    mc__mem_param_terms(&M, desc, out);
    mc__mem_paper_activations(&M, &sched, out);
    mc__mem_impl_activations(&M, out);
    mc__mem_impl_communication(&M, &sched, out);
    return MC_OK;
}

#undef MC__MD
#undef MC__MX

/* @theoretical_memory:implementation end */

#endif /* MEGATRON_C_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the megatron_c authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software
and associated documentation files (the "Software"), to deal in the Software without
restriction, including without limitation the rights to use, copy, modify, merge, publish,
distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
