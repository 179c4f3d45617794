/* megatron_c.h - v0.1.0 - Megatron-Core's parallel machinery in C

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
       MC_ENABLE_CUDA     declare the NCCL communicator backend implemented in
                          megatron_c_cuda.cu (compile that file with nvcc and link it, -lnccl).
       MC_STATIC          make every public function static (private copy per translation unit).
       MC_ASSERT(c)       override assert() for internal invariants.

   WHAT IT IS
       A small, readable re-build of Megatron-Core's core ideas:
         - a communicator table (self, MPI, NCCL) with blocking and async collectives,
         - the rank grid (Megatron's RankGenerator): every rank's coordinates and every
           group kind of Megatron's parallel_state, as a pure function of the sizes,
         - parallel state: the communicators of every group kind, created in
           Megatron's creation order on every rank, behind a group-plan fingerprint
           that turns ranks disagreeing about the plan into an immediate error.

   megatron_c DOES NOT
       - call exit() or print by itself: functions return a status (MC_OK == 0,
         negative on error) and the details go to the logger callback and to
         mc_last_error() (a per-thread string naming the field, the value and the rule).
       - keep hidden global state, apart from the optional process-wide logger and
         allocator set with mc_setup().

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

   ERROR REPORTING
       int rc = mc_grid_init(&g, &d);
       if (rc != MC_OK) fprintf(stderr, "%s: %s\n", mc_err_name(rc), mc_last_error());

   RECENT REVISION HISTORY
       0.1.0  communicators (self, MPI, NCCL), rank grid, parallel state

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

#if defined(MC_STATIC)
#define MC_API static
#else
#define MC_API extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
   >>errors  One list gives the enum, mc_err_name() and mc_strerror(). 0 is success, errors < 0. */
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
   >>setup  Optional process-wide logger and allocator. Zero means default: no logger (silent),
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

/* ---------------------------------------------------------------------------------------------
   >>rank_grid  Megatron's RankGenerator: a pure function of the sizes, no communication.

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
    mc_grid_desc desc;          /* resolved: every default filled in */
    char order[MC_ORDER_MAX];   /* resolved order string, e.g. "tp-cp-ep-dp-pp" */
    int dp;                     /* world / (tp * pp * cp) */
    int edp;                    /* world / (etp * ep * pp) */
    /* Private: the two mixed-radix generators. */
    int n_axes;
    int axis_id[5];             /* order of axes, fastest first: 0 tp, 1 cp, 2 ep, 3 dp, 4 pp */
    int dense_size[5];          /* size of each axis in the dense grid, indexed like axis_id */
    int expert_size[5];         /* ... and in the expert grid */
} mc_grid;

/* Validates and resolves. Errors name the values and Megatron's rule, e.g.
   "world_size (10) is not divisible by tensor_model_parallel_size (2) x
    pipeline_model_parallel_size (4) x context_parallel_size (1) = 8". */
MC_API int mc_grid_init(mc_grid *grid, const mc_grid_desc *desc);
MC_API int mc_grid_coords(const mc_grid *grid, int rank, mc_rank_coords *out);
MC_API int mc_grid_num_groups(const mc_grid *grid, mc_group_kind kind);
MC_API int mc_grid_group_size(const mc_grid *grid, mc_group_kind kind);
/* Writes the members of group `index` (ascending in Megatron's member order) into out[cap];
   returns the member count (>= 0) or an error. */
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
   >>comm  The communicator table. Layer and lab code call the mc_* wrappers below; each
   backend fills an mc_comm_ops. Buffers are host memory for `self` and `mpi`, device memory
   for `nccl`: use mc_comm_alloc / mc_comm_upload / mc_comm_download to stay backend-neutral. */

typedef enum mc_dtype { MC_F32 = 0, MC_F64, MC_I32, MC_I64, MC_U8, MC_BF16, MC_DTYPE_COUNT } mc_dtype;
typedef enum mc_reduce_op { MC_SUM = 0, MC_MAX, MC_MIN, MC_AVG } mc_reduce_op;
typedef enum mc_comm_backend {
    MC_BACKEND_AUTO = 0,   /* nccl when built with CUDA and every rank has its own GPU, else mpi
                              when built with MPI and the world has > 1 rank, else self */
    MC_BACKEND_SELF,
    MC_BACKEND_MPI,
    MC_BACKEND_NCCL
} mc_comm_backend;

MC_API size_t mc_dtype_size(mc_dtype dtype);
MC_API const char *mc_backend_name(mc_comm_backend backend);  /* "self", "mpi", "nccl" */

typedef struct mc_comm mc_comm;
typedef struct mc_request mc_request;   /* handle of an async operation; mc_wait frees it */

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
    void *(*alloc)(mc_comm *c, size_t bytes);
    void (*free)(mc_comm *c, void *ptr);
    int (*upload)(mc_comm *c, void *dst, const void *host_src, size_t bytes);
    int (*download)(mc_comm *c, void *host_dst, const void *src, size_t bytes);
    void (*destroy)(mc_comm *c);
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
    int owns_mpi_init;       /* world only: MPI_Finalize on destroy */
    void *mpi;               /* MPI_Comm * (mpi and nccl backends), else NULL */
    void *impl;              /* backend state */
};

typedef struct mc_comm_desc {
    mc_comm_backend backend;  /* default MC_BACKEND_AUTO */
    double timeout_s;         /* default 30 s; inherited by groups */
    int *argc;                /* passed to MPI_Init when this call initialises MPI */
    char ***argv;
} mc_comm_desc;

/* The world communicator. Initialises MPI when built with MC_COMM_MPI and MPI is not yet
   initialised (and finalises it in mc_comm_destroy). Logs which backend was chosen and why. */
MC_API int mc_comm_init_world(mc_comm **world, const mc_comm_desc *desc);
MC_API void mc_comm_destroy(mc_comm *comm);

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
   `tag` must be the same on all members and unique among concurrent creations. */
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
MC_API int mc_test(mc_request *req, int *done);
/* Backend-neutral buffers (device memory for nccl). */
MC_API void *mc_comm_alloc(mc_comm *c, size_t bytes);
MC_API void mc_comm_free(mc_comm *c, void *ptr);
MC_API int mc_comm_upload(mc_comm *c, void *dst, const void *host_src, size_t bytes);
MC_API int mc_comm_download(mc_comm *c, void *host_dst, const void *src, size_t bytes);

/* ---------------------------------------------------------------------------------------------
   >>parallel_state  Megatron's initialize_model_parallel. */

typedef struct mc_parallel_desc {
    mc_comm *world;       /* required */
    mc_grid_desc grid;    /* grid.world defaults to world->size and must equal it */
    uint64_t plan_salt;   /* mixed into the plan fingerprint; ranks built differently differ */
    int skip_plan_check;  /* 1: do not exchange the fingerprint (only for experiments) */
} mc_parallel_desc;

typedef struct mc_parallel_state {
    int initialized;
    mc_grid grid;
    mc_comm *world;
    mc_rank_coords coords;                   /* of this rank */
    mc_comm *group[MC_GROUP_COUNT];          /* NULL where this rank is in no group of a kind */
    int group_index[MC_GROUP_COUNT];         /* -1 where none */
    uint64_t plan_fingerprint;
    int n_created;                           /* collective creations made, in plan order */
    int vp_stage;                            /* current virtual stage (0 unless interleaved) */
} mc_parallel_state;

/* Exchanges the plan fingerprint over the world (a mismatch fails on every rank within the
   world's timeout, with a message naming the first differing group), then creates every
   group of every kind in plan order, collectively, keeping the ones this rank belongs to. */
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

#if defined(MC_ENABLE_CUDA)
/* Implemented in megatron_c_cuda.cu. */
MC_API int mc__nccl_available(int local_rank, int local_size);  /* 1 if every local rank has a GPU */
MC_API int mc__nccl_init_world(mc_comm *world_mpi_filled);      /* turns an MPI world into NCCL */
MC_API const mc_comm_ops *mc__nccl_ops(void);
#endif

#ifdef __cplusplus
}
#endif
#endif /* MEGATRON_C_H_INCLUDED */

/* ============================================================================================
   IMPLEMENTATION
   ============================================================================================ */
#if defined(MEGATRON_C_IMPLEMENTATION) && !defined(MEGATRON_C_IMPL_INCLUDED)
#define MEGATRON_C_IMPL_INCLUDED

/* (implementation follows) */

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
