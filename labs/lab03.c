/* labs/lab03.c - M003: initialize_model_parallel, measured.

       make lab03 && mpirun --oversubscribe -np 8 ./lab03      (as root add --allow-run-as-root)

   A run does, in order (rank 0 prints, every rank takes part):
     0. reads the answer sheet's header (nonce -> probe rank, follow-up variant) and records a
        hash of the predictions with the time, before anything is measured;
     A. builds every group kind with mc_parallel_init and checks each membership with
        collectives (sum and gather of world ranks), then assembles the layout on rank 0;
     B. walks the same creation plan on a private copy of the world, but lets only the members
        of each embedding group call the (position-paired) creation: the bug of PR #7546;
     C. the same walk with member-local creation for the embedding groups (the analogue of
        new_group(..., use_local_synchronization=True));
     plan check: one rank builds its grid with another order; the fingerprint exchange turns
        that into an immediate MC_ERR_PLAN_MISMATCH on every rank;
     follow-up: the variant drawn by the nonce, from the rank grid and, when it fits this
        world, on real communicators;
     timing (optional): all-reduce in the TP, DP and PP groups, median of 5;
   then writes results/lab03.json and grades answers/lab03.md against it.

   Nothing in B may hang the lab: it runs on its own communicator with a short timeout, a
   rank stops walking at its first timeout, and all ranks meet again on the world. */
#include "lab_common.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grader.h"

#if defined(MC_ENABLE_CUDA)
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#define LAB03_NAME "lab03"
#define LAB03_QUESTION "M003"
#define LAB03_RUBRIC_VERSION "lab03-v1"
#define LAB03_DEFAULT_WORLD 8
#define LAB03_DEFAULT_TP 2
#define LAB03_DEFAULT_PP 2
#define LAB03_N_VARIANTS 3
#define LAB03_B_TIMEOUT_S 5.0
#define LAB03_TIMING_REPEATS 5
#define LAB03_LOCAL_TAG_BASE 3000   /* tags of the member-local embedding creations in C */

/* ---------------------------------------------------------------------------------------------
   Outcomes of experiments B and C. The numeric order is the precedence used to combine ranks:
   a hang stops the whole job without a message, wrong membership silently corrupts what the
   groups compute, an error is reported and stops cleanly. The highest value over all ranks
   is the experiment's outcome. */
typedef enum lab03_outcome {
    LAB03_OK = 0,
    LAB03_ERROR = 1,
    LAB03_WRONG_MEMBERSHIP = 2,
    LAB03_HANG = 3
} lab03_outcome;

static const char *lab03_outcome_name(int outcome) {
    switch (outcome) {
    case LAB03_OK: return "ok";
    case LAB03_ERROR: return "error";
    case LAB03_WRONG_MEMBERSHIP: return "wrong_membership";
    case LAB03_HANG: return "hang";
    default: return "error";
    }
}

/* ---------------------------------------------------------------------------------------------
   Small helpers */

/* "[0,1,4,5]"; long lists are cut with "...". */
static void lab03_format_list(char *out, size_t cap, const int *v, int n) {
    size_t len = 0;
    if (cap == 0) return;
    len += (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < n && len < cap; i++) {
        if (len + 16 >= cap) {
            snprintf(out + len, cap - len, "...");
            len = strlen(out);
            break;
        }
        len += (size_t)snprintf(out + len, cap - len, "%s%d", i ? "," : "", v[i]);
    }
    if (len < cap) snprintf(out + len, cap - len, "]");
}

static int lab03_contains(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

static int lab03_same_set(const int *a, int na, const int *b, int nb) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (!lab03_contains(b, nb, a[i])) return 0;
    return 1;
}

static int lab03_same_list(const int *a, int na, const int *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

static void lab03_group_label(char *out, size_t cap, int kind, int index) {
    snprintf(out, cap, "%s[%d]", mc_group_kind_name((mc_group_kind)kind), index);
}

static void *lab03_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        fprintf(stderr, "[rank %d] lab03: out of memory\n", lab_rank());
        lab_abort(LAB_EXIT_FAILED);
    }
    return p;
}

/* Times go into the results rounded (seconds to 0.1 ms, milliseconds to 1 us): the digits
   beyond that are noise and only make the file harder to read. */
static double lab03_round_s(double seconds) {
    return (double)(long long)(seconds * 1e4 + 0.5) / 1e4;
}
static double lab03_round_ms(double ms) { return (double)(long long)(ms * 1e3 + 0.5) / 1e3; }

/* The library's log lines: the backend choice is kept for the results (it says why), the
   rest is shown only with LAB_VERBOSE=1 (experiment B produces expected timeouts). */
static char lab03_backend_log[256];

static void lab03_logger(const char *tag, uint32_t level, int item, const char *message,
                         uint32_t line, const char *file, void *user_data) {
    (void)item;
    (void)user_data;
    if (message != NULL && level >= 3 && strstr(message, "backend") != NULL &&
        lab03_backend_log[0] == '\0')
        snprintf(lab03_backend_log, sizeof lab03_backend_log, "%s", message);
    const char *verbose = getenv("LAB_VERBOSE");
    if (verbose != NULL && verbose[0] == '1')
        fprintf(stderr, "[rank %d] %s L%u %s:%u %s\n", lab_rank(), tag ? tag : "mc", level,
                file ? file : "?", line, message ? message : "");
}

/* ---------------------------------------------------------------------------------------------
   The run's shared context */

typedef struct lab03_ctx {
    const lab_args *args;
    mc_comm *world;
    int me, world_size;
    mc_grid grid;
    /* answer sheet (read on rank 0, nonce and derived values broadcast) */
    char nonce[LAB_NONCE_LEN + 1];
    int probe_base;          /* probe rank for the default world; the run's is probe_base % W */
    int probe;
    int variant;             /* 1..3 */
    int pred_present, pred_blocks;
    char pred_hash[17];
    char pred_time[32];
    int answers_written;     /* the sheet was missing and a template was written */
    /* environment */
    char backend_reason[256];
    char mpi_library[256];
    char nccl_version[32];
    int gpus;
    double started;
    char started_iso[32];
} lab03_ctx;

/* ---------------------------------------------------------------------------------------------
   Step 0: the answer sheet */

typedef struct lab03_sheet_msg {   /* broadcast from rank 0 */
    char nonce[LAB_NONCE_LEN + 1];
    int probe_base;
    int variant;
} lab03_sheet_msg;

static void lab03_read_sheet_rank0(lab03_ctx *cx) {
    const lab_args *args = cx->args;
    char nonce[17] = "", variant_text[8] = "";
    int header_probe = -1;
    int rc = mc_grade_read_header(args->answers_path, nonce, &header_probe, variant_text);
    if (rc < 0 && access(args->answers_path, F_OK) != 0) {
        printf("%s does not exist: writing the template (as ./lab03 --init does)\n",
               args->answers_path);
        if (lab_init_answers(args, LAB03_DEFAULT_WORLD, LAB03_N_VARIANTS, 0) == LAB_EXIT_OK) {
            cx->answers_written = 1;
            rc = mc_grade_read_header(args->answers_path, nonce, &header_probe, variant_text);
        }
    }
    if (rc < 0 || !lab_nonce_valid(nonce)) {
        if (lab_nonce_new(nonce) != 0) snprintf(nonce, sizeof nonce, "000000");
        printf("warning: %s has no usable header; this run uses the one-off nonce %s "
               "(./lab03 --init writes a sheet with its own nonce)\n",
               args->answers_path, nonce);
    }
    snprintf(cx->nonce, sizeof cx->nonce, "%.6s", nonce);
    cx->probe_base = lab_nonce_probe_rank(cx->nonce, LAB03_DEFAULT_WORLD);
    cx->variant = lab_nonce_variant(cx->nonce, LAB03_N_VARIANTS);
    char derived[8];
    snprintf(derived, sizeof derived, "F%d", cx->variant);
    if (rc >= 0 && (header_probe != cx->probe_base || strcmp(variant_text, derived) != 0))
        printf("warning: the header of %s says probe %d / %s but nonce %s gives probe %d / %s;"
               " the nonce wins (the header is not meant to be edited)\n",
               args->answers_path, header_probe, variant_text, cx->nonce, cx->probe_base,
               derived);

    /* Recorded before any measurement: what the predictions looked like at run time. */
    lab_iso8601_utc(cx->pred_time, sizeof cx->pred_time);
    int filled = 0;
    if (mc_grade_prediction_hash(args->answers_path, cx->pred_hash, &filled) == 0) {
        cx->pred_blocks = filled;
        cx->pred_present = filled > 0;
    } else {
        cx->pred_hash[0] = '\0';
    }
}

static void lab03_step0_sheet(lab03_ctx *cx) {
    lab03_sheet_msg msg;
    memset(&msg, 0, sizeof msg);
    if (cx->me == 0) {
        lab03_read_sheet_rank0(cx);
        memcpy(msg.nonce, cx->nonce, sizeof msg.nonce);
        msg.probe_base = cx->probe_base;
        msg.variant = cx->variant;
    }
    MC_CHECK(lab_broadcast_bytes(cx->world, &msg, sizeof msg, 0));
    memcpy(cx->nonce, msg.nonce, sizeof cx->nonce);
    cx->nonce[LAB_NONCE_LEN] = '\0';
    cx->probe_base = msg.probe_base;
    cx->variant = msg.variant;
    cx->probe = lab_probe_in_world(cx->probe_base, cx->world_size);
}

/* ---------------------------------------------------------------------------------------------
   Environment facts: backend and why, MPI/NCCL versions, GPU count */

static void lab03_describe_backend(lab03_ctx *cx) {
    cx->gpus = 0;
    cx->nccl_version[0] = '\0';
#if defined(MC_ENABLE_CUDA)
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess) cx->gpus = n;
    if (cx->world->backend == MC_BACKEND_NCCL) {
        int v = 0;
        if (ncclGetVersion(&v) == ncclSuccess)
            snprintf(cx->nccl_version, sizeof cx->nccl_version, "%d.%d.%d", v / 10000,
                     (v % 10000) / 100, v % 100);
    }
#endif
    lab_mpi_library_version(cx->mpi_library, sizeof cx->mpi_library);
    if (lab03_backend_log[0] != '\0') {
        /* "world: 8 rank(s), backend mpi (<why>)": keep <why> */
        const char *open = strstr(lab03_backend_log, "backend");
        open = open != NULL ? strchr(open, '(') : NULL;
        const char *close = strrchr(lab03_backend_log, ')');
        if (open != NULL && close != NULL && close > open + 1)
            snprintf(cx->backend_reason, sizeof cx->backend_reason, "%.*s",
                     (int)(close - open - 1), open + 1);
        else
            snprintf(cx->backend_reason, sizeof cx->backend_reason, "%s", lab03_backend_log);
        return;
    }
    const char *why;
    switch (cx->world->backend) {
    case MC_BACKEND_NCCL: why = "every rank has its own GPU"; break;
    case MC_BACKEND_SELF: why = "a single rank: no communication needed"; break;
    default:
#if defined(MC_ENABLE_CUDA)
        why = "not every rank has a GPU of its own, so host buffers over MPI";
#else
        why = "built without CUDA (make cuda builds the NCCL backend), so host buffers over MPI";
#endif
        break;
    }
    if (cx->args->backend != NULL && lab_backend_from_name(cx->args->backend) != MC_BACKEND_AUTO)
        why = "asked for with --backend";
    snprintf(cx->backend_reason, sizeof cx->backend_reason, "%s", why);
}

/* ---------------------------------------------------------------------------------------------
   Membership check of one communicator: the sum of world ranks (all-reduce) and the member
   list in communicator order (all-gather), compared with the planned list. Both collectives
   always run on every member, whatever the first one showed: members of a wrongly paired
   communicator may have planned different lists, and a member that skipped the second call
   would leave the others waiting. */

typedef struct lab03_check {
    int status;             /* MC_OK or the collective's error */
    int sum;                /* all-reduced sum of world ranks */
    int n_observed;
    int *observed;          /* caller's buffer, >= comm size */
    int sum_ok, list_ok, set_ok;
    double seconds;
} lab03_check;

static void lab03_check_membership(mc_comm *comm, int me, const int *planned, int n_planned,
                                   int *observed_buf, lab03_check *out) {
    memset(out, 0, sizeof *out);
    out->observed = observed_buf;
    double t0 = lab_now();
    out->status = lab_all_reduce_i32(comm, &me, &out->sum, 1, MC_SUM);
    if (out->status == MC_OK) out->status = lab_all_gather_i32(comm, &me, observed_buf, 1);
    out->seconds = lab_now() - t0;
    if (out->status != MC_OK) return;
    out->n_observed = comm->size;
    int planned_sum = 0;
    for (int i = 0; i < n_planned; i++) planned_sum += planned[i];
    out->sum_ok = out->sum == planned_sum;
    out->list_ok = lab03_same_list(observed_buf, out->n_observed, planned, n_planned);
    out->set_ok = lab03_same_set(observed_buf, out->n_observed, planned, n_planned);
}

/* ---------------------------------------------------------------------------------------------
   Experiment A: mc_parallel_init, then every group checked and the layout assembled.

   Each rank contributes, per group kind, a record [group index, member count, members...]
   with the members as its communicator reported them (all-gather), plus a small info vector.
   Rank 0 rebuilds the full layout from those records, so the groups in the results are
   what the communicators held, not what the grid predicted. */

enum {   /* per-rank info vector */
    INFO_TP, INFO_CP, INFO_DP, INFO_PP, INFO_FIRST, INFO_LAST, INFO_IN_EMB,
    INFO_LOCAL_OK, INFO_N_CREATED, INFO_PLAN_LEN, INFO_SEQ_DELTA, INFO_COUNT
};

typedef struct lab03_layout {
    int n_groups[MC_GROUP_COUNT];
    int *members[MC_GROUP_COUNT];   /* n_groups x world; row g = group g as observed */
    int *sizes[MC_GROUP_COUNT];     /* observed member count, 0 = no rank reported it */
} lab03_layout;

typedef struct lab03_exp_a {
    mc_parallel_state ps;
    double init_seconds;
    int plan_len;
    mc_plan_entry *plan;
    lab03_layout layout;            /* rank 0 only */
    int *info;                      /* world x INFO_COUNT (all ranks) */
    int *records;                   /* world x MC_GROUP_COUNT x (2 + world) */
    int verified;                   /* every check on every rank, and the assembled layout */
    int sequence_identical;
    int world_calls_min, world_calls_max;   /* creation calls each rank made over the world */
    char problem[512];              /* first thing that did not hold (rank 0) */
} lab03_exp_a;

static int lab03_rec_stride(int world) { return 2 + world; }

static void lab03_collect_local(lab03_ctx *cx, lab03_exp_a *a, int *rec, int *info) {
    const mc_parallel_state *ps = &a->ps;
    int W = cx->world_size, stride = lab03_rec_stride(W);
    int *planned = lab03_xcalloc((size_t)W, sizeof *planned);
    int local_ok = 1;
    for (int k = 0; k < MC_GROUP_COUNT; k++) {
        int *r = rec + k * stride;
        r[0] = -1;
        r[1] = 0;
        int gi = ps->group_index[k];
        int grid_gi = -1;
        mc_grid_group_of(&cx->grid, (mc_group_kind)k, cx->me, &grid_gi, NULL);
        mc_comm *comm = mc_parallel_group(ps, (mc_group_kind)k);
        if (gi != grid_gi || (gi >= 0) != (comm != NULL)) {
            local_ok = 0;   /* the state disagrees with the grid about this rank's group */
            if (comm == NULL) continue;
        }
        if (comm == NULL) continue;
        int n = mc_grid_group_members(&cx->grid, (mc_group_kind)k, gi, planned, W);
        lab03_check chk;
        lab03_check_membership(comm, cx->me, planned, n < 0 ? 0 : n, r + 2, &chk);
        MC_CHECK(chk.status);
        r[0] = gi;
        r[1] = chk.n_observed;
        if (!chk.sum_ok || !chk.list_ok) local_ok = 0;
    }
    free(planned);
    info[INFO_TP] = mc_parallel_rank(ps, MC_GROUP_TP);
    info[INFO_CP] = mc_parallel_rank(ps, MC_GROUP_CP);
    info[INFO_DP] = mc_parallel_rank(ps, MC_GROUP_DP);
    info[INFO_PP] = mc_parallel_rank(ps, MC_GROUP_PP);
    info[INFO_FIRST] = mc_parallel_is_first_stage(ps, 0);
    info[INFO_LAST] = mc_parallel_is_last_stage(ps, 0);
    info[INFO_IN_EMB] = mc_parallel_in_embedding_group(ps, 0);
    info[INFO_LOCAL_OK] = local_ok;
    info[INFO_N_CREATED] = ps->n_created;
    info[INFO_PLAN_LEN] = a->plan_len;
}

/* Rank 0: rebuild every group from the ranks' records and compare with the plan. */
static void lab03_assemble_layout(lab03_ctx *cx, lab03_exp_a *a) {
    int W = cx->world_size, stride = lab03_rec_stride(W);
    int *planned = lab03_xcalloc((size_t)W, sizeof *planned);
    a->verified = 1;
    for (int k = 0; k < MC_GROUP_COUNT; k++) {
        int ng = mc_grid_num_groups(&cx->grid, (mc_group_kind)k);
        if (ng < 0) ng = 0;
        a->layout.n_groups[k] = ng;
        a->layout.members[k] = lab03_xcalloc((size_t)ng * (size_t)W, sizeof(int));
        a->layout.sizes[k] = lab03_xcalloc((size_t)ng, sizeof(int));
        for (int r = 0; r < W; r++) {
            const int *rec = a->records + ((size_t)r * MC_GROUP_COUNT + (size_t)k) * stride;
            int gi = rec[0], n = rec[1];
            if (gi < 0) continue;
            if (gi >= ng) {
                a->verified = 0;
                continue;
            }
            int *row = a->layout.members[k] + (size_t)gi * W;
            if (a->layout.sizes[k][gi] == 0) {
                memcpy(row, rec + 2, (size_t)n * sizeof(int));
                a->layout.sizes[k][gi] = n;
            } else if (!lab03_same_list(row, a->layout.sizes[k][gi], rec + 2, n)) {
                a->verified = 0;
                if (!a->problem[0])
                    snprintf(a->problem, sizeof a->problem,
                             "members of %s disagree about who is in it (rank %d)",
                             mc_group_kind_name((mc_group_kind)k), r);
            }
        }
        for (int g = 0; g < ng; g++) {
            int n = mc_grid_group_members(&cx->grid, (mc_group_kind)k, g, planned, W);
            int got = a->layout.sizes[k][g];
            if (!lab03_same_list(a->layout.members[k] + (size_t)g * W, got, planned, n)) {
                a->verified = 0;
                if (!a->problem[0]) {
                    char want[128], have[128], label[48];
                    lab03_format_list(want, sizeof want, planned, n);
                    lab03_format_list(have, sizeof have, a->layout.members[k] + (size_t)g * W,
                                      got);
                    lab03_group_label(label, sizeof label, k, g);
                    snprintf(a->problem, sizeof a->problem, "%s planned %s, observed %s", label,
                             want, have);
                }
            }
        }
    }
    for (int r = 0; r < W; r++) {
        const int *info = a->info + (size_t)r * INFO_COUNT;
        if (!info[INFO_LOCAL_OK]) {
            a->verified = 0;
            if (!a->problem[0])
                snprintf(a->problem, sizeof a->problem,
                         "rank %d's communicators did not match its plan", r);
        }
    }
    free(planned);
}

/* Each rank's creation sequence: the (kind, index) pairs it walked, gathered and compared
   with rank 0's, together with the number of collective creations its state reports. */
static void lab03_check_sequences(lab03_ctx *cx, lab03_exp_a *a) {
    int W = cx->world_size;
    int same_len = 1;
    a->world_calls_min = a->world_calls_max = a->info[INFO_SEQ_DELTA];
    for (int r = 0; r < W; r++) {
        const int *info = a->info + (size_t)r * INFO_COUNT;
        if (info[INFO_PLAN_LEN] != a->plan_len || info[INFO_N_CREATED] != a->plan_len)
            same_len = 0;
        if (info[INFO_SEQ_DELTA] < a->world_calls_min) a->world_calls_min = info[INFO_SEQ_DELTA];
        if (info[INFO_SEQ_DELTA] > a->world_calls_max) a->world_calls_max = info[INFO_SEQ_DELTA];
    }
    int *mine = lab03_xcalloc((size_t)a->plan_len, sizeof *mine);
    for (int i = 0; i < a->plan_len; i++)
        mine[i] = (int)a->plan[i].kind * 65536 + a->plan[i].index;
    int *all = lab03_xcalloc((size_t)a->plan_len * (size_t)W, sizeof *all);
    a->sequence_identical = 0;
    if (same_len && a->plan_len > 0) {
        MC_CHECK(lab_all_gather_i32(cx->world, mine, all, (size_t)a->plan_len));
        a->sequence_identical = 1;
        for (int r = 1; r < W; r++)
            if (memcmp(all, all + (size_t)r * a->plan_len, (size_t)a->plan_len * sizeof(int)))
                a->sequence_identical = 0;
    }
    free(mine);
    free(all);
}

static void lab03_print_layout(lab03_ctx *cx, const lab03_exp_a *a) {
    static const int show_order[] = {
        MC_GROUP_TP, MC_GROUP_DP, MC_GROUP_PP, MC_GROUP_CP, MC_GROUP_DP_CP, MC_GROUP_MP,
        MC_GROUP_EMBEDDING, MC_GROUP_POSITION_EMBEDDING, MC_GROUP_TP_DP, MC_GROUP_TP_DP_CP,
        MC_GROUP_TP_CP, MC_GROUP_EP, MC_GROUP_EXPERT_TP, MC_GROUP_TP_EP, MC_GROUP_TP_EP_PP,
        MC_GROUP_EXPERT_DP};
    int W = cx->world_size;
    lab_printf0("  %-20s groups (as the communicators reported them)\n", "kind");
    for (size_t i = 0; i < sizeof show_order / sizeof show_order[0]; i++) {
        int k = show_order[i];
        char line[1024];
        size_t len = (size_t)snprintf(line, sizeof line, "  %-20s",
                                      mc_group_kind_name((mc_group_kind)k));
        int ng = a->layout.n_groups[k];
        int shown = ng < 16 ? ng : 16;
        for (int g = 0; g < shown && len < sizeof line - 64; g++) {
            char item[256];
            lab03_format_list(item, sizeof item, a->layout.members[k] + (size_t)g * W,
                              a->layout.sizes[k][g]);
            len += (size_t)snprintf(line + len, sizeof line - len, " %s", item);
        }
        if (shown < ng) snprintf(line + len, sizeof line - len, " ... (%d more)", ng - shown);
        lab_printf0("%s\n", line);
    }
}

/* The probe rank's groups, as its own records reported them. */
static const int *lab03_probe_group(const lab03_ctx *cx, const lab03_exp_a *a, int kind,
                                    int *n) {
    int stride = lab03_rec_stride(cx->world_size);
    const int *rec = a->records + ((size_t)cx->probe * MC_GROUP_COUNT + (size_t)kind) * stride;
    *n = rec[0] >= 0 ? rec[1] : -1;
    return rec + 2;
}

static void lab03_print_probe(lab03_ctx *cx, const lab03_exp_a *a) {
    const int *info = a->info + (size_t)cx->probe * INFO_COUNT;
    lab_printf0("probe rank %d: tp_rank %d, cp_rank %d, dp_rank %d, pp_rank %d | first stage %s,"
                " last stage %s, in embedding group %s\n",
                cx->probe, info[INFO_TP], info[INFO_CP], info[INFO_DP], info[INFO_PP],
                info[INFO_FIRST] ? "yes" : "no", info[INFO_LAST] ? "yes" : "no",
                info[INFO_IN_EMB] ? "yes" : "no");
    static const int kinds[] = {MC_GROUP_TP, MC_GROUP_DP, MC_GROUP_PP, MC_GROUP_MP,
                                MC_GROUP_EMBEDDING};
    char line[1024];
    size_t len = (size_t)snprintf(line, sizeof line, " ");
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        int n = 0;
        const int *m = lab03_probe_group(cx, a, kinds[i], &n);
        char item[256];
        if (n < 0)
            snprintf(item, sizeof item, "none");
        else
            lab03_format_list(item, sizeof item, m, n);
        len += (size_t)snprintf(line + len, sizeof line - len, " %s %s",
                                mc_group_kind_name((mc_group_kind)kinds[i]), item);
    }
    lab_printf0("%s\n", line);
}

static void lab03_experiment_a(lab03_ctx *cx, lab03_exp_a *a) {
    int W = cx->world_size;
    memset(a, 0, sizeof *a);
    lab_printf0("\n== A. initialize_model_parallel on real communicators ==\n");
    lab_printf0("backend: %s (%s)\n", mc_backend_name(cx->world->backend), cx->backend_reason);

    a->plan_len = mc_grid_creation_plan(&cx->grid, NULL, 0);
    MC_CHECK(a->plan_len < 0 ? a->plan_len : MC_OK);
    a->plan = lab03_xcalloc((size_t)a->plan_len, sizeof *a->plan);
    mc_grid_creation_plan(&cx->grid, a->plan, a->plan_len);

    int seq_before = cx->world->create_seq;
    double t0 = lab_now();
    mc_parallel_desc pd = {.world = cx->world, .grid = cx->grid.desc};
    MC_CHECK(mc_parallel_init(&a->ps, &pd));
    a->init_seconds = lab_now() - t0;

    int stride = lab03_rec_stride(W);
    int *rec = lab03_xcalloc((size_t)MC_GROUP_COUNT * stride, sizeof *rec);
    int info[INFO_COUNT];
    memset(info, 0, sizeof info);
    lab03_collect_local(cx, a, rec, info);
    info[INFO_SEQ_DELTA] = cx->world->create_seq - seq_before;

    a->records = lab03_xcalloc((size_t)W * MC_GROUP_COUNT * stride, sizeof *a->records);
    a->info = lab03_xcalloc((size_t)W * INFO_COUNT, sizeof *a->info);
    MC_CHECK(lab_all_gather_i32(cx->world, rec, a->records, (size_t)MC_GROUP_COUNT * stride));
    MC_CHECK(lab_all_gather_i32(cx->world, info, a->info, INFO_COUNT));
    free(rec);
    lab03_check_sequences(cx, a);
    if (cx->me == 0) lab03_assemble_layout(cx, a);
    /* everyone learns the verdict, so every rank can pick the exit code */
    MC_CHECK(lab_broadcast_bytes(cx->world, &a->verified, sizeof a->verified, 0));

    lab_printf0("world %d = tp %d x cp %d x dp %d x pp %d, order %s (ep %d, etp %d, "
                "expert dp %d)\n",
                W, cx->grid.desc.tp, cx->grid.desc.cp, cx->grid.dp, cx->grid.desc.pp,
                cx->grid.order, cx->grid.desc.ep, cx->grid.desc.etp, cx->grid.edp);
    lab_printf0("created %d groups in %.2f s; creation sequence identical on all %d ranks: %s\n",
                a->plan_len, a->init_seconds, W, a->sequence_identical ? "yes" : "NO");
    if (a->world_calls_min == a->world_calls_max)
        lab_printf0("every rank, member or not, made %d collective creation calls over the "
                    "world\n",
                    a->world_calls_min);
    else
        lab_printf0("ranks made between %d and %d collective creation calls over the world\n",
                    a->world_calls_min, a->world_calls_max);
    lab_printf0("membership checked by all-reduce + all-gather in every group of %d kinds: %s\n",
                MC_GROUP_COUNT, a->verified ? "all match the plan" : "MISMATCH");
    if (cx->me == 0 && !a->verified) lab_printf0("  first problem: %s\n", a->problem);
    if (cx->me == 0) {
        lab03_print_layout(cx, a);
        lab03_print_probe(cx, a);
    }
}

/* ---------------------------------------------------------------------------------------------
   Experiments B and C: walk the creation plan on a private copy of the world.

   mode BUG:   the embedding groups are created with position pairing (verify = 0) and only
               by their members; everybody else skips them, as in PR #7546.
   mode LOCAL: the embedding groups are created member-locally (only members call, one tag
               per group); the other kinds are created collectively as usual.
   Every creation is followed, on its members, by the membership check. A rank stops at its
   first timeout or error (its copy of the world may hold an unfinished operation from then
   on) and keeps going after a wrong membership, as a real program would. */

typedef enum lab03_walk_mode { LAB03_WALK_BUG, LAB03_WALK_LOCAL } lab03_walk_mode;

enum {   /* a rank's walk record, gathered to everyone */
    W_OUTCOME, W_CALL, W_KIND, W_GROUP, W_PHASE, W_STATUS, W_CALLS, W_SKIPPED, W_LOCAL,
    W_F_OUTCOME, W_F_CALL, W_F_KIND, W_F_GROUP, W_N_OBS, W_OBS   /* W_OBS: world entries */
};
enum { WD_SECONDS, WD_WALK, WD_COUNT };

typedef struct lab03_walk {
    int *rec;        /* W_OBS + world */
    double d[WD_COUNT];
} lab03_walk;

static void lab03_walk_event(lab03_walk *w, int outcome, int call, const mc_plan_entry *e,
                             int phase, int status, double seconds, const int *obs, int n_obs) {
    int *r = w->rec;
    if (r[W_F_OUTCOME] == LAB03_OK) {
        r[W_F_OUTCOME] = outcome;
        r[W_F_CALL] = call;
        r[W_F_KIND] = (int)e->kind;
        r[W_F_GROUP] = e->index;
    }
    if (outcome <= r[W_OUTCOME]) return;   /* keep the most severe, earliest event */
    r[W_OUTCOME] = outcome;
    r[W_CALL] = call;
    r[W_KIND] = (int)e->kind;
    r[W_GROUP] = e->index;
    r[W_PHASE] = phase;
    r[W_STATUS] = status;
    r[W_N_OBS] = n_obs;
    if (n_obs > 0) memcpy(r + W_OBS, obs, (size_t)n_obs * sizeof *obs);
    w->d[WD_SECONDS] = seconds;
}

/* One creation (or a skip) plus its membership check. Returns 0 to go on, 1 to stop. */
static int lab03_walk_step(lab03_ctx *cx, mc_comm *parent, lab03_walk_mode mode,
                           const mc_plan_entry *e, int *call, double walk_start,
                           lab03_walk *w, int *planned, int *observed) {
    int W = cx->world_size;
    int n = mc_grid_group_members(&cx->grid, e->kind, e->index, planned, W);
    MC_CHECK(n < 0 ? n : MC_OK);
    int member = lab03_contains(planned, n, cx->me);
    int embedding = e->kind == MC_GROUP_EMBEDDING;
    mc_comm *child = NULL;
    int rc;
    double t0 = lab_now();
    if (embedding && !member) {
        if (mode == LAB03_WALK_BUG) w->rec[W_SKIPPED]++;   /* the bug: non-members skip */
        return 0;                                          /* LOCAL: not theirs to call */
    }
    int this_call = (*call)++;
    if (embedding && mode == LAB03_WALK_LOCAL) {
        w->rec[W_LOCAL]++;
        rc = mc_comm_create_group_local(parent, planned, n, LAB03_LOCAL_TAG_BASE + e->index,
                                        &child);
    } else if (mode == LAB03_WALK_BUG) {
        rc = mc_comm_create_group_ex(parent, planned, n, 0, &child);
    } else {
        rc = mc_comm_create_group(parent, planned, n, &child);
    }
    w->rec[W_CALLS] = *call;
    if (rc != MC_OK) {
        int outcome = rc == MC_ERR_TIMEOUT ? LAB03_HANG : LAB03_ERROR;
        double secs = rc == MC_ERR_TIMEOUT ? lab_now() - t0 : lab_now() - walk_start;
        lab03_walk_event(w, outcome, this_call, e, 0, rc, secs, NULL, 0);
        return 1;
    }
    if (child == NULL) return 0;   /* not a member of what was created at this call */
    lab03_check chk;
    lab03_check_membership(child, cx->me, planned, n, observed, &chk);
    if (chk.status != MC_OK) {
        int outcome = chk.status == MC_ERR_TIMEOUT ? LAB03_HANG : LAB03_ERROR;
        double secs = chk.status == MC_ERR_TIMEOUT ? chk.seconds : lab_now() - walk_start;
        lab03_walk_event(w, outcome, this_call, e, 1, chk.status, secs, NULL, 0);
        return 1;
    }
    if (!chk.set_ok)
        lab03_walk_event(w, LAB03_WRONG_MEMBERSHIP, this_call, e, 1, MC_OK,
                         lab_now() - walk_start, observed, chk.n_observed);
    /* The children are never destroyed: in B some are mispaired and a peer may still owe
       them an operation, in C they are cheap and gone at exit. Freeing a communicator with
       an operation pending would be undefined behaviour in the backend. */
    return 0;
}

static void lab03_walk_plan(lab03_ctx *cx, const lab03_exp_a *a, mc_comm *parent,
                            lab03_walk_mode mode, lab03_walk *w) {
    int W = cx->world_size;
    int *planned = lab03_xcalloc((size_t)W, sizeof *planned);
    int *observed = lab03_xcalloc((size_t)W, sizeof *observed);
    int call = 0;
    double start = lab_now();
    for (int i = 0; i < a->plan_len; i++)
        if (lab03_walk_step(cx, parent, mode, &a->plan[i], &call, start, w, planned, observed))
            break;
    w->rec[W_CALLS] = call;
    w->d[WD_WALK] = lab_now() - start;
    if (w->rec[W_OUTCOME] == LAB03_OK) w->d[WD_SECONDS] = w->d[WD_WALK];
    free(planned);
    free(observed);
}

/* The combined result of a walk over all ranks (rank 0 builds the text). */
typedef struct lab03_walk_summary {
    int outcome;
    int rank;                    /* rank whose event decided it (-1 when ok) */
    int call_index;              /* -1 when ok */
    char group[48];
    double seconds;
    double walk_seconds;         /* slowest rank */
    double timeout_s;
    char detail[768];
    int first_outcome, first_rank, first_call;
    char first_group[48];
    int *rank_outcomes;          /* world */
    int *rank_calls;             /* world */
    int *rank_skipped;           /* world */
    int local_creations;         /* summed over ranks (C) */
} lab03_walk_summary;

static const int *lab03_walk_rec(const int *all, int rank, int W) {
    return all + (size_t)rank * (size_t)(W_OBS + W);
}

/* "1,3,5" */
static void lab03_format_ranks(char *out, size_t cap, const int *ranks, int n) {
    char list[512];
    lab03_format_list(list, sizeof list, ranks, n);
    size_t len = strlen(list);
    if (len >= 2) list[len - 1] = '\0';
    snprintf(out, cap, "%s", list + 1);
}

static void lab03_describe_hang(const lab03_ctx *cx, const int *all, lab03_walk_summary *s) {
    int W = cx->world_size;
    const int *r = lab03_walk_rec(all, s->rank, W);
    int *waiting = lab03_xcalloc((size_t)W, sizeof(int));
    int *absent = lab03_xcalloc((size_t)W, sizeof(int));
    int n_wait = 0, n_absent = 0, absent_calls = -1, absent_skipped = 0;
    for (int q = 0; q < W; q++) {
        const int *rq = lab03_walk_rec(all, q, W);
        if (rq[W_OUTCOME] == LAB03_HANG && rq[W_CALL] == s->call_index)
            waiting[n_wait++] = q;
        else if (rq[W_CALLS] <= s->call_index) {
            absent[n_absent++] = q;
            absent_calls = rq[W_CALLS];
            absent_skipped = rq[W_SKIPPED];
        }
    }
    char wl[512], al[512], planned_txt[128];
    int *planned = lab03_xcalloc((size_t)W, sizeof(int));
    int n = mc_grid_group_members(&cx->grid, (mc_group_kind)r[W_KIND], r[W_GROUP], planned, W);
    lab03_format_list(planned_txt, sizeof planned_txt, planned, n < 0 ? 0 : n);
    lab03_format_ranks(wl, sizeof wl, waiting, n_wait);
    lab03_format_ranks(al, sizeof al, absent, n_absent);
    int used = snprintf(s->detail, sizeof s->detail,
                        "rank%s %s waited %.1f s in %s call #%d (%s, planned %s) and gave up",
                        n_wait > 1 ? "s" : "", wl, s->seconds,
                        r[W_PHASE] ? "the membership check after creation" : "creation",
                        s->call_index, s->group, planned_txt);
    if (n_absent > 0 && used > 0 && (size_t)used < sizeof s->detail)
        snprintf(s->detail + used, sizeof s->detail - (size_t)used,
                 "; rank%s %s never made that call: %s skipped %d embedding creation%s and "
                 "left the walk after %d calls",
                 n_absent > 1 ? "s" : "", al, n_absent > 1 ? "each" : "it", absent_skipped,
                 absent_skipped == 1 ? "" : "s", absent_calls);
    free(planned);
    free(waiting);
    free(absent);
}

static void lab03_summarize_walk(const lab03_ctx *cx, const int *all, const double *alld,
                                 lab03_walk_summary *s) {
    int W = cx->world_size;
    s->outcome = LAB03_OK;
    s->rank = -1;
    s->call_index = -1;
    s->first_outcome = LAB03_OK;
    s->first_rank = -1;
    s->first_call = -1;
    for (int q = 0; q < W; q++) {
        const int *r = lab03_walk_rec(all, q, W);
        s->rank_outcomes[q] = r[W_OUTCOME];
        s->rank_calls[q] = r[W_CALLS];
        s->rank_skipped[q] = r[W_SKIPPED];
        s->local_creations += r[W_LOCAL];
        if (alld[q * WD_COUNT + WD_WALK] > s->walk_seconds)
            s->walk_seconds = alld[q * WD_COUNT + WD_WALK];
        /* the deciding event: highest precedence, then earliest call, then lowest rank */
        if (r[W_OUTCOME] > s->outcome ||
            (r[W_OUTCOME] == s->outcome && r[W_OUTCOME] != LAB03_OK && r[W_CALL] < s->call_index)) {
            s->outcome = r[W_OUTCOME];
            s->rank = q;
            s->call_index = r[W_CALL];
            s->seconds = alld[q * WD_COUNT + WD_SECONDS];
            lab03_group_label(s->group, sizeof s->group, r[W_KIND], r[W_GROUP]);
        }
        if (r[W_F_OUTCOME] != LAB03_OK && (s->first_rank < 0 || r[W_F_CALL] < s->first_call)) {
            s->first_outcome = r[W_F_OUTCOME];
            s->first_rank = q;
            s->first_call = r[W_F_CALL];
            lab03_group_label(s->first_group, sizeof s->first_group, r[W_F_KIND],
                              r[W_F_GROUP]);
        }
    }
    if (s->outcome == LAB03_OK) {
        s->seconds = s->walk_seconds;
        snprintf(s->detail, sizeof s->detail,
                 "every rank finished the walk (%d creation calls on rank 0) and every "
                 "membership check matched the plan",
                 s->rank_calls[0]);
        return;
    }
    const int *r = lab03_walk_rec(all, s->rank, W);
    if (s->outcome == LAB03_HANG) {
        lab03_describe_hang(cx, all, s);
    } else if (s->outcome == LAB03_WRONG_MEMBERSHIP) {
        int *planned = lab03_xcalloc((size_t)W, sizeof(int));
        int n = mc_grid_group_members(&cx->grid, (mc_group_kind)r[W_KIND], r[W_GROUP],
                                      planned, W);
        char have[256], want[256];
        lab03_format_list(have, sizeof have, r + W_OBS, r[W_N_OBS]);
        lab03_format_list(want, sizeof want, planned, n < 0 ? 0 : n);
        snprintf(s->detail, sizeof s->detail,
                 "rank %d joined a communicator of %d ranks %s for a group planned as %s "
                 "(%s, creation call #%d)",
                 s->rank, r[W_N_OBS], have, want, s->group, s->call_index);
        free(planned);
    } else {
        snprintf(s->detail, sizeof s->detail, "rank %d got %s (%s) at creation call #%d (%s)",
                 s->rank, mc_err_name(r[W_STATUS]), mc_strerror(r[W_STATUS]), s->call_index,
                 s->group);
    }
}

/* A private copy of the world: the creation calls of B and C stay off the world's own
   sequence, and B's leftovers (unmatched operations) can never reach the world. */
static mc_comm *lab03_copy_world(lab03_ctx *cx, double timeout_s) {
    int W = cx->world_size;
    int *all = lab03_xcalloc((size_t)W, sizeof *all);
    for (int i = 0; i < W; i++) all[i] = i;
    mc_comm *copy = NULL;
    MC_CHECK(mc_comm_create_group(cx->world, all, W, &copy));
    free(all);
    copy->timeout_s = timeout_s;   /* the watchdog for every call made over the copy */
    return copy;
}

static void lab03_run_walk(lab03_ctx *cx, const lab03_exp_a *a, lab03_walk_mode mode,
                           double timeout_s, lab03_walk_summary *s) {
    int W = cx->world_size;
    memset(s, 0, sizeof *s);
    s->timeout_s = timeout_s;
    s->rank_outcomes = lab03_xcalloc((size_t)W, sizeof(int));
    s->rank_calls = lab03_xcalloc((size_t)W, sizeof(int));
    s->rank_skipped = lab03_xcalloc((size_t)W, sizeof(int));

    mc_comm *copy = lab03_copy_world(cx, timeout_s);
    lab03_walk w;
    w.rec = lab03_xcalloc((size_t)(W_OBS + W), sizeof(int));
    memset(w.d, 0, sizeof w.d);
    lab03_walk_plan(cx, a, copy, mode, &w);
    /* The copy is deliberately never destroyed: after a timeout it may hold an operation
       that will never complete, and freeing it under that operation is not allowed. */

    /* Meet again on the world (its own, longer timeout) and share the records. */
    int *all = lab03_xcalloc((size_t)W * (size_t)(W_OBS + W), sizeof(int));
    double *alld = lab03_xcalloc((size_t)W * WD_COUNT, sizeof(double));
    MC_CHECK(lab_all_gather_i32(cx->world, w.rec, all, (size_t)(W_OBS + W)));
    MC_CHECK(lab_all_gather_f64(cx->world, w.d, alld, WD_COUNT));
    lab03_summarize_walk(cx, all, alld, s);
    free(all);
    free(alld);
    free(w.rec);
}

static void lab03_print_walk(const lab03_ctx *cx, const lab03_walk_summary *s) {
    lab_printf0("outcome: %s", lab03_outcome_name(s->outcome));
    if (s->outcome != LAB03_OK)
        lab_printf0(" at creation call #%d (%s) after %.2f s", s->call_index, s->group,
                    s->seconds);
    lab_printf0("   [walk %.2f s, timeout %.1f s]\n", s->walk_seconds, s->timeout_s);
    lab_printf0("  %s\n", s->detail);
    if (s->first_rank >= 0 && (s->first_outcome != s->outcome || s->first_call != s->call_index))
        lab_printf0("  first sign of trouble: %s at call #%d (%s) on rank %d\n",
                    lab03_outcome_name(s->first_outcome), s->first_call, s->first_group,
                    s->first_rank);
    char line[1024];
    size_t len = (size_t)snprintf(line, sizeof line, "  per rank (outcome/calls):");
    for (int q = 0; q < cx->world_size && q < 32 && len < sizeof line - 40; q++)
        len += (size_t)snprintf(line + len, sizeof line - len, " %d:%s/%d", q,
                                lab03_outcome_name(s->rank_outcomes[q]), s->rank_calls[q]);
    lab_printf0("%s\n", line);
}

static void lab03_experiment_b(lab03_ctx *cx, const lab03_exp_a *a, double timeout_s,
                               lab03_walk_summary *s) {
    lab_printf0("\n== B. only the members create each embedding group (the bug) ==\n");
    lab_printf0("same %d-call plan on a copy of the world; embedding groups paired by call "
                "position (verify=0) and called by members only; timeout %.1f s per call\n",
                a->plan_len, timeout_s);
    lab03_run_walk(cx, a, LAB03_WALK_BUG, timeout_s, s);
    lab03_print_walk(cx, s);
}

static void lab03_experiment_c(lab03_ctx *cx, const lab03_exp_a *a, double timeout_s,
                               lab03_walk_summary *s) {
    lab_printf0("\n== C. the same groups created member-locally ==\n");
    lab_printf0("embedding groups made with mc_comm_create_group_local by their members only "
                "(one tag per group); the other kinds collectively\n");
    lab03_run_walk(cx, a, LAB03_WALK_LOCAL, timeout_s, s);
    if (s->outcome == LAB03_OK) {
        char more[256];
        snprintf(more, sizeof more, "; %d member-local creations over all ranks",
                 s->local_creations);
        strncat(s->detail, more, sizeof s->detail - strlen(s->detail) - 1);
    }
    lab03_print_walk(cx, s);
}

/* ---------------------------------------------------------------------------------------------
   Plan check: the last rank builds its grid with dp and pp swapped in the order string. */

typedef struct lab03_plan_check {
    int outcome;            /* LAB03_ERROR expected */
    int all_mismatch;       /* every rank got MC_ERR_PLAN_MISMATCH */
    int status0;
    double seconds;         /* slowest rank */
    char message[768];      /* rank 0's */
    char odd_order[MC_ORDER_MAX];
    int used_salt;
} lab03_plan_check;

/* "tp-cp-ep-dp-pp" -> "tp-cp-ep-pp-dp" */
static void lab03_swap_dp_pp(const char *order, char *out, size_t cap) {
    char buf[MC_ORDER_MAX * 2];
    snprintf(buf, sizeof buf, "%s", order);
    out[0] = '\0';
    char *save = NULL;
    for (char *tok = strtok_r(buf, "-", &save); tok != NULL; tok = strtok_r(NULL, "-", &save)) {
        const char *t = strcmp(tok, "dp") == 0 ? "pp" : strcmp(tok, "pp") == 0 ? "dp" : tok;
        if (out[0] != '\0') strncat(out, "-", cap - strlen(out) - 1);
        strncat(out, t, cap - strlen(out) - 1);
    }
}

static void lab03_plan_check_run(lab03_ctx *cx, lab03_plan_check *pc) {
    memset(pc, 0, sizeof *pc);
    int W = cx->world_size;
    lab_printf0("\n== Plan check: one rank disagrees about the plan ==\n");
    lab03_swap_dp_pp(cx->grid.order, pc->odd_order, sizeof pc->odd_order);
    mc_grid odd;
    mc_grid_desc od = cx->grid.desc;
    od.order = pc->odd_order;
    pc->used_salt = mc_grid_init(&odd, &od) != MC_OK;   /* then a salt makes the difference */
    int odd_rank = W - 1;
    const mc_grid *mine = &cx->grid;
    uint64_t salt = 0;
    if (cx->me == odd_rank && W > 1) {
        if (pc->used_salt) salt = 0x5eed;
        else mine = &odd;
    }
    if (pc->used_salt)
        lab_printf0("rank %d builds the same grid with plan_salt 0x5eed (order %s is refused "
                    "for these sizes); the others with plan_salt 0\n",
                    odd_rank, pc->odd_order);
    else
        lab_printf0("rank %d builds its grid with order %s; the others with order %s\n",
                    odd_rank, pc->odd_order, cx->grid.order);
    double t0 = lab_now();
    int rc = mc_parallel_check_plan(cx->world, mine, salt);
    double secs = lab_now() - t0;
    snprintf(pc->message, sizeof pc->message, "%s", rc == MC_OK ? "" : mc_last_error());

    int *codes = lab03_xcalloc((size_t)W, sizeof(int));
    MC_CHECK(lab_all_gather_i32(cx->world, &rc, codes, 1));
    double slowest = 0.0;
    MC_CHECK(lab_all_reduce_f64(cx->world, &secs, &slowest, 1, MC_MAX));
    pc->seconds = slowest;
    pc->status0 = codes[0];
    pc->all_mismatch = W > 1;
    int any_timeout = 0, all_ok = 1;
    for (int q = 0; q < W; q++) {
        if (codes[q] != MC_ERR_PLAN_MISMATCH) pc->all_mismatch = 0;
        if (codes[q] == MC_ERR_TIMEOUT) any_timeout = 1;
        if (codes[q] != MC_OK) all_ok = 0;
    }
    pc->outcome = any_timeout ? LAB03_HANG : all_ok ? LAB03_OK : LAB03_ERROR;
    free(codes);
    lab_printf0("outcome: %s in %.3f s; %s on %s\n", lab03_outcome_name(pc->outcome), pc->seconds,
                mc_err_name(pc->status0), pc->all_mismatch ? "every rank" : "some ranks");
    if (pc->message[0]) lab_printf0("  rank 0: %s\n", pc->message);
}

/* ---------------------------------------------------------------------------------------------
   Follow-up: the variant drawn by the nonce (grading_design.md D.4). */

typedef struct lab03_variant_spec {
    int world, tp, cp, pp;
    const char *order;   /* NULL = default */
    const char *what;
} lab03_variant_spec;

static const lab03_variant_spec lab03_variants[LAB03_N_VARIANTS] = {
    {16, 2, 2, 2, NULL, "world 16, TP=2, CP=2, PP=2, default order"},
    {8, 2, 1, 2, "tp-pp-dp", "world 8, TP=2, PP=2, order tp-pp-dp"},
    {8, 4, 1, 2, NULL, "world 8, TP=4, PP=2 (DP=1)"},
};

static const int lab03_followup_kinds[] = {MC_GROUP_TP, MC_GROUP_PP, MC_GROUP_DP, MC_GROUP_CP,
                                           MC_GROUP_DP_CP, MC_GROUP_MP, MC_GROUP_EMBEDDING};
#define LAB03_N_FOLLOWUP_KINDS ((int)(sizeof lab03_followup_kinds / sizeof(int)))

typedef struct lab03_followup {
    const lab03_variant_spec *spec;
    mc_grid grid;
    int grid_status;
    char grid_error[256];
    int probe;
    int order_assert_would_fire;
    int order_accepted;
    int built;                  /* built on this run's communicators */
    int verified;
} lab03_followup;

static int lab03_ends_with_pp(const char *order) {
    size_t n = strlen(order);
    return n >= 2 && strcmp(order + n - 2, "pp") == 0;
}

/* Builds the variant's groups with mc_parallel_init on this world and checks each one. */
static int lab03_followup_on_comms(lab03_ctx *cx, lab03_followup *f) {
    mc_parallel_state fps;
    mc_parallel_desc pd = {.world = cx->world, .grid = f->grid.desc};
    MC_CHECK(mc_parallel_init(&fps, &pd));
    int W = cx->world_size;
    int *planned = lab03_xcalloc((size_t)W, sizeof(int));
    int *observed = lab03_xcalloc((size_t)W, sizeof(int));
    int ok = 1;
    for (int i = 0; i < LAB03_N_FOLLOWUP_KINDS; i++) {
        int k = lab03_followup_kinds[i];
        mc_comm *comm = mc_parallel_group(&fps, (mc_group_kind)k);
        int gi = -1;
        mc_grid_group_of(&f->grid, (mc_group_kind)k, cx->me, &gi, NULL);
        if ((comm != NULL) != (gi >= 0)) ok = 0;
        if (comm == NULL) continue;
        int n = mc_grid_group_members(&f->grid, (mc_group_kind)k, gi, planned, W);
        lab03_check chk;
        lab03_check_membership(comm, cx->me, planned, n, observed, &chk);
        MC_CHECK(chk.status);
        if (!chk.sum_ok || !chk.list_ok) ok = 0;
    }
    free(planned);
    free(observed);
    int all_ok = 0;
    MC_CHECK(lab_all_reduce_i32(cx->world, &ok, &all_ok, 1, MC_MIN));
    MC_CHECK(mc_parallel_destroy(&fps));
    return all_ok;
}

static void lab03_followup_run(lab03_ctx *cx, lab03_followup *f) {
    memset(f, 0, sizeof *f);
    f->spec = &lab03_variants[cx->variant - 1];
    lab_printf0("\n== Follow-up M003-F%d: %s ==\n", cx->variant, f->spec->what);
    mc_grid_desc d = {.world = f->spec->world, .tp = f->spec->tp, .cp = f->spec->cp,
                      .pp = f->spec->pp, .order = f->spec->order};
    f->grid_status = mc_grid_init(&f->grid, &d);
    if (f->grid_status != MC_OK) {
        snprintf(f->grid_error, sizeof f->grid_error, "%s", mc_last_error());
        lab_printf0("the rank grid refused the variant: %s\n", f->grid_error);
        return;
    }
    f->probe = lab_probe_in_world(cx->probe_base, f->spec->world);
    const char *order = f->spec->order != NULL ? f->spec->order : f->grid.order;
    /* Megatron's assert in initialize_model_parallel: pp last, or PP = 1, or equal DP sizes
       in the dense and expert grids. */
    f->order_assert_would_fire =
        !(lab03_ends_with_pp(order) || f->grid.desc.pp == 1 || f->grid.edp == f->grid.dp);
    f->order_accepted = !f->order_assert_would_fire;
    if (f->spec->world == cx->world_size) {
        f->built = 1;
        f->verified = lab03_followup_on_comms(cx, f);
    }
    lab_printf0("dp_size %d, order %s (resolved %s): %s\n", f->grid.dp, order, f->grid.order,
                f->order_accepted ? "accepted" : "Megatron's order assert would fire");
    if (f->built)
        lab_printf0("built on this run's %d ranks with mc_parallel_init: membership %s\n",
                    cx->world_size, f->verified ? "verified" : "MISMATCH");
    else
        lab_printf0("world %d differs from this run's %d ranks: groups from the rank grid only"
                    " (mpirun -np %d to build them)\n",
                    f->spec->world, cx->world_size, f->spec->world);
}

/* ---------------------------------------------------------------------------------------------
   Timing: all-reduce in the TP, DP and PP groups, median of 5 (slowest rank per repeat). */

typedef struct lab03_timing {
    int done;
    size_t bytes;
    double ms[3];
    int size[3];
} lab03_timing;

static const int lab03_timing_kinds[3] = {MC_GROUP_TP, MC_GROUP_DP, MC_GROUP_PP};

static double lab03_time_one(lab03_ctx *cx, mc_comm *g, void *send, void *recv, size_t count) {
    double times[LAB03_TIMING_REPEATS];
    MC_CHECK(mc_all_reduce(g, send, recv, count, MC_F32, MC_SUM));   /* warm-up */
    for (int i = 0; i < LAB03_TIMING_REPEATS; i++) {
        MC_CHECK(mc_barrier(cx->world));
        double t0 = lab_now();
        MC_CHECK(mc_all_reduce(g, send, recv, count, MC_F32, MC_SUM));
        double mine = lab_now() - t0, slowest = 0.0;
        MC_CHECK(lab_all_reduce_f64(cx->world, &mine, &slowest, 1, MC_MAX));
        times[i] = slowest;
    }
    return lab_median(times, LAB03_TIMING_REPEATS) * 1000.0;
}

static void lab03_timing_run(lab03_ctx *cx, lab03_exp_a *a, lab03_timing *t) {
    memset(t, 0, sizeof *t);
    lab_printf0("\n== Timing: all-reduce in the TP, DP and PP groups ==\n");
    /* 64 MiB as in the lab text on GPUs; 4 MiB keeps 8 CPU ranks on 2 cores quick. */
    t->bytes = cx->world->backend == MC_BACKEND_NCCL ? (size_t)64 << 20 : (size_t)4 << 20;
    size_t count = t->bytes / sizeof(float);
    float *host = lab03_xcalloc(count, sizeof(float));
    for (size_t i = 0; i < count; i++) host[i] = (float)(i % 7);
    for (int i = 0; i < 3; i++) {
        mc_comm *g = mc_parallel_group(&a->ps, (mc_group_kind)lab03_timing_kinds[i]);
        t->size[i] = g->size;
        void *send = mc_comm_alloc(g, t->bytes), *recv = mc_comm_alloc(g, t->bytes);
        if (send == NULL || recv == NULL) MC_CHECK(MC_ERR_NO_MEMORY);
        MC_CHECK(mc_comm_upload(g, send, host, t->bytes));
        t->ms[i] = lab03_time_one(cx, g, send, recv, count);
        mc_comm_free(g, send);
        mc_comm_free(g, recv);
    }
    free(host);
    t->done = 1;
    lab_printf0("%zu bytes, median of %d: tp %.2f ms (size %d), dp %.2f ms (size %d), "
                "pp %.2f ms (size %d)\n",
                t->bytes, LAB03_TIMING_REPEATS, t->ms[0], t->size[0], t->ms[1], t->size[1],
                t->ms[2], t->size[2]);
}

/* ---------------------------------------------------------------------------------------------
   results/lab03.json (the contract the grader reads) */

static cJSON *lab03_layout_json(const lab03_ctx *cx, const lab03_layout *l, int kind) {
    cJSON *arr = cJSON_CreateArray();
    for (int g = 0; g < l->n_groups[kind]; g++)
        cJSON_AddItemToArray(arr, lab_json_int_array(l->members[kind] + (size_t)g * cx->world_size,
                                                     l->sizes[kind][g]));
    return arr;
}

static cJSON *lab03_grid_groups_json(const mc_grid *grid, int kind) {
    cJSON *arr = cJSON_CreateArray();
    int ng = mc_grid_num_groups(grid, (mc_group_kind)kind);
    int *m = lab03_xcalloc((size_t)grid->desc.world, sizeof(int));
    for (int g = 0; g < ng; g++) {
        int n = mc_grid_group_members(grid, (mc_group_kind)kind, g, m, grid->desc.world);
        cJSON_AddItemToArray(arr, lab_json_int_array(m, n < 0 ? 0 : n));
    }
    free(m);
    return arr;
}

/* The members of `rank`'s group of `kind` in the grid, or null when it has none. */
static cJSON *lab03_grid_group_of_json(const mc_grid *grid, int kind, int rank) {
    int gi = -1;
    if (mc_grid_group_of(grid, (mc_group_kind)kind, rank, &gi, NULL) != MC_OK || gi < 0)
        return cJSON_CreateNull();
    int *m = lab03_xcalloc((size_t)grid->desc.world, sizeof(int));
    int n = mc_grid_group_members(grid, (mc_group_kind)kind, gi, m, grid->desc.world);
    cJSON *arr = lab_json_int_array(m, n < 0 ? 0 : n);
    free(m);
    return arr;
}

static cJSON *lab03_config_json(const lab03_ctx *cx) {
    const mc_grid_desc *d = &cx->grid.desc;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "world", cx->world_size);
    cJSON_AddNumberToObject(c, "tp", d->tp);
    cJSON_AddNumberToObject(c, "pp", d->pp);
    cJSON_AddNumberToObject(c, "cp", d->cp);
    cJSON_AddNumberToObject(c, "ep", d->ep);
    cJSON_AddNumberToObject(c, "etp", d->etp);
    cJSON_AddNumberToObject(c, "vpp", d->vpp);
    cJSON_AddStringToObject(c, "order", cx->grid.order);
    cJSON_AddStringToObject(c, "backend", mc_backend_name(cx->world->backend));
    cJSON_AddStringToObject(c, "backend_reason", cx->backend_reason);
    cJSON_AddStringToObject(c, "mpi_library", cx->mpi_library);
    if (cx->nccl_version[0])
        cJSON_AddStringToObject(c, "nccl_version", cx->nccl_version);
    else
        cJSON_AddNullToObject(c, "nccl_version");
    cJSON_AddNumberToObject(c, "gpus", cx->gpus);
    cJSON_AddNumberToObject(c, "timeout_seconds", cx->world->timeout_s);
    return c;
}

static cJSON *lab03_predictions_json(const lab03_ctx *cx) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddBoolToObject(p, "present_at_run", cx->pred_present);
    if (cx->pred_hash[0])
        cJSON_AddStringToObject(p, "hash", cx->pred_hash);
    else
        cJSON_AddNullToObject(p, "hash");
    cJSON_AddStringToObject(p, "time", cx->pred_time);
    cJSON_AddNumberToObject(p, "filled_blocks", cx->pred_blocks);
    cJSON_AddStringToObject(p, "answers_path", cx->args->answers_path);
    cJSON_AddBoolToObject(p, "template_written_by_run", cx->answers_written);
    return p;
}

static cJSON *lab03_probe_json(const lab03_ctx *cx, const lab03_exp_a *a) {
    const int *info = a->info + (size_t)cx->probe * INFO_COUNT;
    cJSON *p = cJSON_CreateObject();
    cJSON_AddNumberToObject(p, "rank", cx->probe);
    cJSON_AddNumberToObject(p, "tp_rank", info[INFO_TP]);
    cJSON_AddNumberToObject(p, "dp_rank", info[INFO_DP]);
    cJSON_AddNumberToObject(p, "pp_rank", info[INFO_PP]);
    cJSON_AddNumberToObject(p, "cp_rank", info[INFO_CP]);
    cJSON_AddBoolToObject(p, "is_first_stage", info[INFO_FIRST]);
    cJSON_AddBoolToObject(p, "is_last_stage", info[INFO_LAST]);
    cJSON_AddBoolToObject(p, "in_embedding_group", info[INFO_IN_EMB]);
    static const struct { int kind; const char *key; } groups[] = {
        {MC_GROUP_TP, "tp_group"}, {MC_GROUP_DP, "dp_group"}, {MC_GROUP_PP, "pp_group"},
        {MC_GROUP_MP, "mp_group"}, {MC_GROUP_EMBEDDING, "embedding_group"},
        {MC_GROUP_CP, "cp_group"}, {MC_GROUP_DP_CP, "dp_cp_group"},
        {MC_GROUP_POSITION_EMBEDDING, "position_embedding_group"}};
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        int n = 0;
        const int *m = lab03_probe_group(cx, a, groups[i].kind, &n);
        cJSON_AddItemToObject(p, groups[i].key,
                              n < 0 ? cJSON_CreateNull() : lab_json_int_array(m, n));
    }
    return p;
}

/* Kinds in creation order, with runs of the same kind collapsed ("pp", "embedding", ...). */
static cJSON *lab03_sequence_json(const lab03_exp_a *a) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < a->plan_len; i++)
        if (i == 0 || a->plan[i].kind != a->plan[i - 1].kind)
            cJSON_AddItemToArray(arr, cJSON_CreateString(mc_group_kind_name(a->plan[i].kind)));
    return arr;
}

static cJSON *lab03_walk_json(const lab03_ctx *cx, const lab03_walk_summary *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", lab03_outcome_name(s->outcome));
    if (s->outcome == LAB03_OK) {
        cJSON_AddNullToObject(o, "call_index");
        cJSON_AddNullToObject(o, "group");
    } else {
        cJSON_AddNumberToObject(o, "call_index", s->call_index);
        cJSON_AddStringToObject(o, "group", s->group);
        cJSON_AddNumberToObject(o, "rank", s->rank);
    }
    cJSON_AddNumberToObject(o, "seconds", lab03_round_s(s->seconds));
    cJSON_AddNumberToObject(o, "timeout_seconds", s->timeout_s);
    cJSON_AddNumberToObject(o, "walk_seconds", lab03_round_s(s->walk_seconds));
    cJSON_AddStringToObject(o, "detail", s->detail);
    if (s->first_rank >= 0) {
        cJSON *f = cJSON_AddObjectToObject(o, "first_failure");
        cJSON_AddStringToObject(f, "outcome", lab03_outcome_name(s->first_outcome));
        cJSON_AddNumberToObject(f, "call_index", s->first_call);
        cJSON_AddStringToObject(f, "group", s->first_group);
        cJSON_AddNumberToObject(f, "rank", s->first_rank);
    }
    cJSON *per = cJSON_AddArrayToObject(o, "rank_outcomes");
    for (int q = 0; q < cx->world_size; q++)
        cJSON_AddItemToArray(per, cJSON_CreateString(lab03_outcome_name(s->rank_outcomes[q])));
    cJSON_AddItemToObject(o, "rank_calls", lab_json_int_array(s->rank_calls, cx->world_size));
    cJSON_AddItemToObject(o, "rank_skipped", lab_json_int_array(s->rank_skipped, cx->world_size));
    cJSON_AddStringToObject(o, "precedence", "hang > wrong_membership > error > ok");
    return o;
}

static cJSON *lab03_plan_check_json(const lab03_plan_check *pc) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", lab03_outcome_name(pc->outcome));
    cJSON_AddNumberToObject(o, "seconds", lab03_round_s(pc->seconds));
    cJSON_AddStringToObject(o, "message", pc->message);
    cJSON_AddStringToObject(o, "status", mc_err_name(pc->status0));
    cJSON_AddBoolToObject(o, "every_rank_refused", pc->all_mismatch);
    if (pc->used_salt)
        cJSON_AddStringToObject(o, "odd_rank_change", "plan_salt");
    else
        cJSON_AddStringToObject(o, "odd_rank_order", pc->odd_order);
    return o;
}

static cJSON *lab03_followup_json(const lab03_ctx *cx, const lab03_followup *f) {
    cJSON *o = cJSON_CreateObject();
    char variant[8];
    snprintf(variant, sizeof variant, "F%d", cx->variant);
    cJSON_AddStringToObject(o, "variant", variant);
    cJSON_AddNumberToObject(o, "world", f->spec->world);
    cJSON_AddNumberToObject(o, "tp", f->spec->tp);
    cJSON_AddNumberToObject(o, "pp", f->spec->pp);
    cJSON_AddNumberToObject(o, "cp", f->spec->cp);
    if (f->grid_status != MC_OK) {
        cJSON_AddStringToObject(o, "order", f->spec->order ? f->spec->order : "tp-cp-ep-dp-pp");
        cJSON_AddStringToObject(o, "error", f->grid_error);
        cJSON_AddBoolToObject(o, "order_accepted", 0);
        return o;
    }
    const mc_grid *g = &f->grid;
    cJSON_AddStringToObject(o, "order", f->spec->order ? f->spec->order : g->order);
    cJSON_AddStringToObject(o, "resolved_order", g->order);
    cJSON_AddNumberToObject(o, "dp_size", g->dp);
    cJSON_AddNumberToObject(o, "probe_rank", f->probe);
    cJSON *groups = cJSON_AddObjectToObject(o, "groups");
    for (int i = 0; i < LAB03_N_FOLLOWUP_KINDS; i++) {
        int k = lab03_followup_kinds[i];
        cJSON_AddItemToObject(groups, mc_group_kind_name((mc_group_kind)k),
                              lab03_grid_groups_json(g, k));
    }
    mc_rank_coords rc;
    memset(&rc, 0, sizeof rc);
    mc_grid_coords(g, f->probe, &rc);
    int first = 0, last = 0;
    mc_grid_pipeline_ranks(g, f->probe, &first, &last, NULL, NULL);
    cJSON *p = cJSON_AddObjectToObject(o, "probe");
    cJSON_AddNumberToObject(p, "tp_rank", rc.tp);
    cJSON_AddNumberToObject(p, "dp_rank", rc.dp);
    cJSON_AddNumberToObject(p, "pp_rank", rc.pp);
    cJSON_AddNumberToObject(p, "cp_rank", rc.cp);
    cJSON_AddBoolToObject(p, "is_first_stage", rc.pp == 0);
    cJSON_AddBoolToObject(p, "is_last_stage", rc.pp == g->desc.pp - 1);
    static const struct { int kind; const char *key; } pg[] = {
        {MC_GROUP_TP, "tp_group"}, {MC_GROUP_DP, "dp_group"}, {MC_GROUP_PP, "pp_group"},
        {MC_GROUP_CP, "cp_group"}, {MC_GROUP_DP_CP, "dp_cp_group"}, {MC_GROUP_MP, "mp_group"},
        {MC_GROUP_EMBEDDING, "embedding_group"}};
    for (size_t i = 0; i < sizeof pg / sizeof pg[0]; i++)
        cJSON_AddItemToObject(p, pg[i].key, lab03_grid_group_of_json(g, pg[i].kind, f->probe));
    cJSON_AddBoolToObject(o, "order_accepted", f->order_accepted);
    cJSON_AddBoolToObject(o, "order_assert_would_fire", f->order_assert_would_fire);
    cJSON_AddBoolToObject(o, "built_on_communicators", f->built);
    cJSON_AddBoolToObject(o, "verified_on_communicators", f->built && f->verified);
    return o;
}

static cJSON *lab03_timing_json(const lab03_timing *t) {
    if (!t->done) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "allreduce_bytes", (double)t->bytes);
    cJSON_AddNumberToObject(o, "tp_ms", lab03_round_ms(t->ms[0]));
    cJSON_AddNumberToObject(o, "dp_ms", lab03_round_ms(t->ms[1]));
    cJSON_AddNumberToObject(o, "pp_ms", lab03_round_ms(t->ms[2]));
    cJSON_AddNumberToObject(o, "tp_size", t->size[0]);
    cJSON_AddNumberToObject(o, "dp_size", t->size[1]);
    cJSON_AddNumberToObject(o, "pp_size", t->size[2]);
    cJSON_AddNumberToObject(o, "repeats", LAB03_TIMING_REPEATS);
    cJSON_AddStringToObject(o, "statistic", "median over repeats of the slowest rank");
    return o;
}

typedef struct lab03_results {
    lab03_exp_a a;
    lab03_walk_summary b, c;
    lab03_plan_check plan;
    lab03_followup followup;
    lab03_timing timing;
} lab03_results;

static cJSON *lab03_facts_json(const lab03_ctx *cx, const lab03_results *r) {
    const lab03_exp_a *a = &r->a;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "dp_size", cx->grid.dp);
    cJSON_AddNumberToObject(f, "world", cx->world_size);
    cJSON_AddNumberToObject(f, "expert_dp_size", cx->grid.edp);
    cJSON *groups = cJSON_AddObjectToObject(f, "groups");
    for (int k = 0; k < MC_GROUP_COUNT; k++)
        cJSON_AddItemToObject(groups, mc_group_kind_name((mc_group_kind)k),
                              lab03_layout_json(cx, &a->layout, k));
    static const struct { int kind; const char *key; } flat[] = {
        {MC_GROUP_TP, "tp_groups"}, {MC_GROUP_DP, "dp_groups"}, {MC_GROUP_PP, "pp_groups"},
        {MC_GROUP_MP, "mp_groups"}, {MC_GROUP_EMBEDDING, "embedding_groups"},
        {MC_GROUP_POSITION_EMBEDDING, "position_embedding_groups"}};
    for (size_t i = 0; i < sizeof flat / sizeof flat[0]; i++)
        cJSON_AddItemToObject(f, flat[i].key, lab03_layout_json(cx, &a->layout, flat[i].kind));
    cJSON_AddItemToObject(f, "probe", lab03_probe_json(cx, a));
    cJSON_AddBoolToObject(f, "membership_verified", a->verified);
    cJSON_AddNumberToObject(f, "groups_created", a->plan_len);
    cJSON_AddNumberToObject(f, "init_seconds", lab03_round_s(a->init_seconds));
    cJSON_AddItemToObject(f, "creation_sequence", lab03_sequence_json(a));
    cJSON_AddBoolToObject(f, "creation_sequence_identical", a->sequence_identical);
    /* measured on the world communicator's own creation counter, every rank */
    cJSON *calls = cJSON_AddObjectToObject(f, "world_creation_calls");
    cJSON_AddNumberToObject(calls, "min", a->world_calls_min);
    cJSON_AddNumberToObject(calls, "max", a->world_calls_max);
    cJSON_AddItemToObject(f, "exp_b", lab03_walk_json(cx, &r->b));
    cJSON_AddItemToObject(f, "exp_c", lab03_walk_json(cx, &r->c));
    cJSON_AddItemToObject(f, "plan_check", lab03_plan_check_json(&r->plan));
    cJSON_AddItemToObject(f, "followup", lab03_followup_json(cx, &r->followup));
    cJSON_AddItemToObject(f, "timing", lab03_timing_json(&r->timing));
    return f;
}

static cJSON *lab03_results_json(const lab03_ctx *cx, const lab03_results *r) {
    cJSON *doc = lab_results_new(LAB03_NAME, LAB03_QUESTION, LAB03_RUBRIC_VERSION);
    cJSON_AddItemToObject(doc, "config", lab03_config_json(cx));
    cJSON_AddStringToObject(doc, "nonce", cx->nonce);
    cJSON_AddNumberToObject(doc, "probe_rank", cx->probe);
    char variant[8];
    snprintf(variant, sizeof variant, "F%d", cx->variant);
    cJSON_AddStringToObject(doc, "followup_variant", variant);
    cJSON_AddItemToObject(doc, "predictions", lab03_predictions_json(cx));
    cJSON *run = cJSON_AddObjectToObject(doc, "run");
    cJSON_AddStringToObject(run, "started", cx->started_iso);
    cJSON_AddNumberToObject(run, "seconds", lab03_round_s(lab_now() - cx->started));
    cJSON_AddItemToObject(doc, "facts", lab03_facts_json(cx, r));
    return doc;
}

/* ---------------------------------------------------------------------------------------------
   Summary of what was measured (rank 0), printed before the score table. */

static void lab03_print_summary(const lab03_ctx *cx, const lab03_results *r) {
    const lab03_exp_a *a = &r->a;
    lab_printf0("\n== Measured ==\n");
    lab_printf0("dp_size %d; membership verified %s; %d groups created, sequence identical %s\n",
                cx->grid.dp, a->verified ? "yes" : "no", a->plan_len,
                a->sequence_identical ? "yes" : "no");
    lab_printf0("exp B %s, exp C %s, plan check %s; follow-up F%d dp_size %d%s\n",
                lab03_outcome_name(r->b.outcome), lab03_outcome_name(r->c.outcome),
                lab03_outcome_name(r->plan.outcome), cx->variant,
                r->followup.grid_status == MC_OK ? r->followup.grid.dp : -1,
                r->followup.built ? (r->followup.verified ? " (verified on communicators)"
                                                           : " (communicators MISMATCH)")
                                  : "");
}

/* ---------------------------------------------------------------------------------------------
   The run */

static const char lab03_summary[] =
    "lab03 (M003): builds every group of Megatron's initialize_model_parallel on real\n"
    "communicators, injects the \"only members create the group\" bug, repeats it with\n"
    "member-local creation, shows the plan fingerprint check, then grades answers/lab03.md.\n"
    "Defaults: TP=2, PP=2 on 8 ranks (DP derived).";

static const char lab03_specific[] =
    "\nlab03: --timeout sets the per-call watchdog of experiments B and C (default 5 s);\n"
    "       timing is on by default up to 8 ranks; LAB_VERBOSE=1 shows the library's log.\n";

/* Validates the sizes against this world; on failure every rank prints nothing but rank 0,
   and all of them leave with LAB_EXIT_USAGE. */
static int lab03_make_grid(lab03_ctx *cx) {
    const lab_args *args = cx->args;
    mc_grid_desc d = {
        .world = cx->world_size,
        .tp = args->tp ? args->tp : LAB03_DEFAULT_TP,
        .pp = args->pp ? args->pp : LAB03_DEFAULT_PP,
        .cp = args->cp,
        .ep = args->ep,
        .etp = args->etp,
        .vpp = args->vpp,
        .order = args->order,
    };
    int rc = mc_grid_init(&cx->grid, &d);
    if (rc == MC_OK) return 0;
    int cp = d.cp ? d.cp : 1;
    int model = d.tp * d.pp * cp;
    int suggest = ((cx->world_size + model - 1) / model) * model;
    if (suggest < LAB03_DEFAULT_WORLD && LAB03_DEFAULT_WORLD % model == 0)
        suggest = LAB03_DEFAULT_WORLD;
    char cp_text[24] = "";
    if (cp > 1) snprintf(cp_text, sizeof cp_text, " cp=%d", cp);
    if (cx->world_size % model != 0)
        lab_printf0("lab03 needs world %% (tp*pp*cp) == 0: got %d rank%s for tp=%d pp=%d%s; "
                    "try mpirun -np %d\n",
                    cx->world_size, cx->world_size == 1 ? "" : "s", d.tp, d.pp, cp_text,
                    suggest);
    else
        lab_printf0("lab03 cannot lay out %d ranks with tp=%d pp=%d cp=%d ep=%d etp=%d "
                    "order=%s:\n  %s: %s\n",
                    cx->world_size, d.tp, d.pp, cp, d.ep ? d.ep : 1, d.etp ? d.etp : d.tp,
                    d.order ? d.order : "tp-cp-ep-dp-pp", mc_err_name(rc), mc_last_error());
    return LAB_EXIT_USAGE;
}

static void lab03_print_header(const lab03_ctx *cx) {
    lab_printf0("lab03 / M003 initialize_model_parallel: world %d, tp %d, pp %d, cp %d, dp %d, "
                "order %s\n",
                cx->world_size, cx->grid.desc.tp, cx->grid.desc.pp, cx->grid.desc.cp, cx->grid.dp,
                cx->grid.order);
    lab_printf0("answers %s: nonce %s -> probe rank %d, follow-up F%d\n", cx->args->answers_path,
                cx->nonce, cx->probe, cx->variant);
    if (cx->me == 0)
        lab_printf0("predictions at run time: %s (%d block%s filled, hash %s, %s)\n",
                    cx->pred_present ? "present" : "not filled in", cx->pred_blocks,
                    cx->pred_blocks == 1 ? "" : "s", cx->pred_hash[0] ? cx->pred_hash : "-",
                    cx->pred_time);
}

static void lab03_walk_summary_free(lab03_walk_summary *s) {
    free(s->rank_outcomes);
    free(s->rank_calls);
    free(s->rank_skipped);
}

/* Host memory only: the communicators of A are destroyed by mc_parallel_destroy. */
static void lab03_results_free(lab03_results *r) {
    free(r->a.plan);
    free(r->a.info);
    free(r->a.records);
    for (int k = 0; k < MC_GROUP_COUNT; k++) {
        free(r->a.layout.members[k]);
        free(r->a.layout.sizes[k]);
    }
    lab03_walk_summary_free(&r->b);
    lab03_walk_summary_free(&r->c);
    free(r);
}

static int lab03_exit_code(const lab03_results *r) {
    int ok = r->a.verified && r->a.sequence_identical && r->c.outcome == LAB03_OK &&
             r->plan.outcome == LAB03_ERROR &&
             (!r->followup.built || r->followup.verified);
    return ok ? LAB_EXIT_OK : LAB_EXIT_FAILED;
}

static int lab03_run(const lab_args *args, int *argc, char ***argv) {
    lab03_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.args = args;
    cx.started = lab_now();
    lab_iso8601_utc(cx.started_iso, sizeof cx.started_iso);
    mc_setup(&(mc_desc){.logger = {.func = lab03_logger}});

    /* The world must outwait B's watchdog: ranks that finished B wait on the world for the
       ones still stuck in a call over the copy. */
    double walk_timeout = args->timeout_s > 0 ? args->timeout_s : LAB03_B_TIMEOUT_S;
    double world_timeout = 3.0 * walk_timeout > 30.0 ? 3.0 * walk_timeout : 0.0;
    mc_comm_desc cd = {.backend = (mc_comm_backend)lab_backend_from_name(args->backend),
                       .timeout_s = world_timeout, .argc = argc, .argv = argv};
    MC_CHECK(mc_comm_init_world(&cx.world, &cd));
    cx.me = cx.world->rank;
    cx.world_size = cx.world->size;
    lab_set_rank(cx.me);

    if (lab03_make_grid(&cx) != 0) {
        mc_comm_destroy(cx.world);
        return LAB_EXIT_USAGE;
    }
    lab03_describe_backend(&cx);
    lab03_step0_sheet(&cx);
    lab03_print_header(&cx);

    lab03_results *r = lab03_xcalloc(1, sizeof *r);
    lab03_experiment_a(&cx, &r->a);
    lab03_experiment_b(&cx, &r->a, walk_timeout, &r->b);
    lab03_experiment_c(&cx, &r->a, walk_timeout, &r->c);
    lab03_plan_check_run(&cx, &r->plan);
    lab03_followup_run(&cx, &r->followup);
    int timing = args->timing >= 0 ? args->timing : cx.world_size <= 8;
    if (timing) lab03_timing_run(&cx, &r->a, &r->timing);

    int write_rc = MC_OK;
    if (cx.me == 0) {
        cJSON *doc = lab03_results_json(&cx, r);
        write_rc = lab_json_write_atomic(doc, args->results_path);
        lab03_print_summary(&cx, r);
        if (write_rc == MC_OK) lab_printf0("wrote %s\n", args->results_path);
        if (args->json) {
            char *text = cJSON_Print(doc);
            if (text != NULL) lab_printf0("%s\n", text);
            free(text);
        }
        cJSON_Delete(doc);
    }
    int exit_code = lab03_exit_code(r);
    MC_CHECK(mc_parallel_destroy(&r->a.ps));
    lab03_results_free(r);
    MC_CHECK(mc_barrier(cx.world));
    if (cx.me == 0 && write_rc == MC_OK) {
        lab_printf0("\n== Grading %s ==\n", args->answers_path);
        if (lab_grade(args, 1) < 0) exit_code = LAB_EXIT_FAILED;
    } else if (write_rc != MC_OK) {
        exit_code = LAB_EXIT_FAILED;
    }
    mc_comm_destroy(cx.world);
    return exit_code;
}

int main(int argc, char **argv) {
    lab_args args;
    char err[256];
    if (lab_parse_args(argc, argv, LAB03_NAME, &args, err, sizeof err) != 0) {
        if (lab_launcher_rank() == 0) {
            fprintf(stderr, "lab03: %s\n\n", err);
            lab_print_usage(stderr, LAB03_NAME, NULL, lab03_specific);
        }
        return LAB_EXIT_USAGE;
    }
    if (args.help) {
        if (lab_launcher_rank() == 0)
            lab_print_usage(stdout, LAB03_NAME, lab03_summary, lab03_specific);
        return LAB_EXIT_OK;
    }
    /* --init and --grade-only need no MPI: under mpirun only the first rank acts. */
    if (args.init)
        return lab_launcher_rank() == 0
                   ? lab_init_answers(&args, LAB03_DEFAULT_WORLD, LAB03_N_VARIANTS, args.force)
                   : LAB_EXIT_OK;
    if (args.grade_only) {
        if (lab_launcher_rank() != 0) return LAB_EXIT_OK;
        return lab_grade(&args, 1) < 0 ? LAB_EXIT_FAILED : LAB_EXIT_OK;
    }
    return lab03_run(&args, &argc, &argv);
}
