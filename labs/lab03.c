/* labs/lab03.c - M003: initialize_model_parallel, measured.

       make lab03 && mpirun --oversubscribe -np 8 ./lab03      (as root add --allow-run-as-root)

   The experiments, in order (rank 0 prints, every rank takes part; the driver, lab_driver.h,
   does the answer sheet, the results envelope and the grading around them):
     A. builds every group kind with mc_parallel_init and checks each membership with
        collectives (sum and gather of world ranks), assembles the layout on rank 0 and
        records what the getters return on the probe rank;
     M. builds a tiny GPT with mc_gpt_init on top of the same parallel state: the model, not
        the parallel state, decides which layers and which parameter shards a rank holds;
     B. walks the same creation plan on a private copy of the world, but lets only the members
        of each embedding group call the (position-paired) creation: the bug of PR #7546;
     C. the same walk with member-local creation for the embedding groups (the analogue of
        new_group(..., use_local_synchronization=True));
     plan check: one rank builds its grid with another order; the fingerprint exchange turns
        that into an immediate MC_ERR_PLAN_MISMATCH on every rank;
     follow-up: the variant drawn by the nonce, from the rank grid and, when it fits this
        world, on real communicators;
     D. (the follow-up's experiment) the probe rank swaps two of its creation calls: paired by
        position the groups come out crossed and all-reduces return wrong sums without any
        error; with the group-plan check the same swap is an immediate error naming both lists;
     timing (optional): all-reduce in the TP, DP and PP groups, median of 5;
     destroy: mc_parallel_destroy, watched: which groups are released, in which order.

   Nothing in B may hang the lab: it runs on its own communicator with a short timeout, a
   rank stops walking at its first timeout, and all ranks meet again on the world. */
#include "lab_driver.h"

#include <stdlib.h>
#include <string.h>

#define LAB03_N_VARIANTS 3
#define LAB03_TIMING_REPEATS 5
#define LAB03_LOCAL_TAG_BASE 3000   /* tags of the member-local embedding creations in C */

/* ---------------------------------------------------------------------------------------------
   Outcomes of experiments B and C. The numeric order is the precedence used to combine ranks:
   a hang stops the whole job without a message, wrong membership silently corrupts what the
   groups compute, an error is reported and stops cleanly. The highest value over all ranks
   is the experiment's outcome. Experiment D adds silent_wrong_result: every call succeeded,
   yet a collective returned a wrong value (it ranks with wrong membership). */
typedef enum lab03_outcome {
    LAB03_OK = 0,
    LAB03_ERROR = 1,
    LAB03_WRONG_MEMBERSHIP = 2,
    LAB03_HANG = 3,
    LAB03_SILENT_WRONG = 4
} lab03_outcome;

static const char *lab03_outcome_name(int outcome) {
    switch (outcome) {
    case LAB03_OK: return "ok";
    case LAB03_ERROR: return "error";
    case LAB03_WRONG_MEMBERSHIP: return "wrong_membership";
    case LAB03_HANG: return "hang";
    case LAB03_SILENT_WRONG: return "silent_wrong_result";
    default: return "error";
    }
}

/* ---------------------------------------------------------------------------------------------
   Small helpers */

static void lab03_group_label(char *out, size_t cap, int kind, int index) {
    snprintf(out, cap, "%s[%d]", mc_group_kind_name((mc_group_kind)kind), index);
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
    out->list_ok = lab_ints_same_list(observed_buf, out->n_observed, planned, n_planned);
    out->set_ok = lab_ints_same_set(observed_buf, out->n_observed, planned, n_planned);
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
    long long heap_bytes;           /* what mc_parallel_init left allocated on this rank */
    cJSON *getters;                 /* what the getters return on the probe rank (all ranks) */
    int destroyed;                  /* mc_parallel_destroy ran (experiment "destroy") */
} lab03_exp_a;

static int lab03_rec_stride(int world) { return 2 + world; }

static void lab03_collect_local(lab_ctx *cx, lab03_exp_a *a, int *rec, int *info) {
    const mc_parallel_state *ps = &a->ps;
    int W = cx->world_size, stride = lab03_rec_stride(W);
    int *planned = lab_xcalloc((size_t)W, sizeof *planned);
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
static void lab03_assemble_layout(lab_ctx *cx, lab03_exp_a *a) {
    int W = cx->world_size, stride = lab03_rec_stride(W);
    int *planned = lab_xcalloc((size_t)W, sizeof *planned);
    a->verified = 1;
    for (int k = 0; k < MC_GROUP_COUNT; k++) {
        int ng = mc_grid_num_groups(&cx->grid, (mc_group_kind)k);
        if (ng < 0) ng = 0;
        a->layout.n_groups[k] = ng;
        a->layout.members[k] = lab_xcalloc((size_t)ng * (size_t)W, sizeof(int));
        a->layout.sizes[k] = lab_xcalloc((size_t)ng, sizeof(int));
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
            } else if (!lab_ints_same_list(row, a->layout.sizes[k][gi], rec + 2, n)) {
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
            if (!lab_ints_same_list(a->layout.members[k] + (size_t)g * W, got, planned, n)) {
                a->verified = 0;
                if (!a->problem[0]) {
                    char want[128], have[128], label[48];
                    lab_format_ints(want, sizeof want, planned, n);
                    lab_format_ints(have, sizeof have, a->layout.members[k] + (size_t)g * W,
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
static void lab03_check_sequences(lab_ctx *cx, lab03_exp_a *a) {
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
    int *mine = lab_xcalloc((size_t)a->plan_len, sizeof *mine);
    for (int i = 0; i < a->plan_len; i++)
        mine[i] = (int)a->plan[i].kind * 65536 + a->plan[i].index;
    int *all = lab_xcalloc((size_t)a->plan_len * (size_t)W, sizeof *all);
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

static void lab03_print_layout(lab_ctx *cx, const lab03_exp_a *a) {
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
            lab_format_ints(item, sizeof item, a->layout.members[k] + (size_t)g * W,
                              a->layout.sizes[k][g]);
            len += (size_t)snprintf(line + len, sizeof line - len, " %s", item);
        }
        if (shown < ng) snprintf(line + len, sizeof line - len, " ... (%d more)", ng - shown);
        lab_printf0("%s\n", line);
    }
}

/* The probe rank's groups, as its own records reported them. */
static const int *lab03_probe_group(const lab_ctx *cx, const lab03_exp_a *a, int kind,
                                    int *n) {
    int stride = lab03_rec_stride(cx->world_size);
    const int *rec = a->records + ((size_t)cx->probe * MC_GROUP_COUNT + (size_t)kind) * stride;
    *n = rec[0] >= 0 ? rec[1] : -1;
    return rec + 2;
}

static void lab03_print_probe(lab_ctx *cx, const lab03_exp_a *a) {
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
            lab_format_ints(item, sizeof item, m, n);
        len += (size_t)snprintf(line + len, sizeof line - len, " %s %s",
                                mc_group_kind_name((mc_group_kind)kinds[i]), item);
    }
    lab_printf0("%s\n", line);
}

/* {"tp": f(tp), ...} over every kind; null where this rank has no group of the kind. */
static cJSON *lab03_per_kind(const mc_parallel_state *ps,
                             int (*f)(const mc_parallel_state *, mc_group_kind)) {
    cJSON *o = cJSON_CreateObject();
    for (int k = 0; k < MC_GROUP_COUNT; k++) {
        const char *name = mc_group_kind_name((mc_group_kind)k);
        if (mc_parallel_group(ps, (mc_group_kind)k) != NULL)
            cJSON_AddNumberToObject(o, name, f(ps, (mc_group_kind)k));
        else
            cJSON_AddNullToObject(o, name);
    }
    return o;
}

/* What the library's getters return on this rank (Megatron's get_*_rank / _world_size /
   _src_rank, the stage predicates and three special groups' members). */
static cJSON *lab03_getters_json(const lab_ctx *cx, const mc_parallel_state *ps) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", cx->me);
    cJSON_AddItemToObject(o, "group_rank", lab03_per_kind(ps, mc_parallel_rank));
    cJSON_AddItemToObject(o, "group_size", lab03_per_kind(ps, mc_parallel_size));
    cJSON_AddItemToObject(o, "src_rank", lab03_per_kind(ps, mc_parallel_src_rank));
    static const char *const preds[] = {"is_first_stage", "is_last_stage", "in_embedding_group"};
    int (*const fn[])(const mc_parallel_state *, int) = {
        mc_parallel_is_first_stage, mc_parallel_is_last_stage, mc_parallel_in_embedding_group};
    char key[64];
    for (int i = 0; i < 3; i++) {
        cJSON_AddBoolToObject(o, preds[i], fn[i](ps, 0));
        snprintf(key, sizeof key, "%s_ignore_virtual", preds[i]);
        cJSON_AddBoolToObject(o, key, fn[i](ps, 1));
    }
    static const int lists[] = {MC_GROUP_EMBEDDING, MC_GROUP_POSITION_EMBEDDING, MC_GROUP_MP};
    for (int i = 0; i < 3; i++) {
        mc_comm *c = mc_parallel_group(ps, (mc_group_kind)lists[i]);
        snprintf(key, sizeof key, "%s_group", mc_group_kind_name((mc_group_kind)lists[i]));
        cJSON_AddItemToObject(o, key, c != NULL ? lab_json_int_array(c->world_ranks, c->size)
                                                : cJSON_CreateNull());
    }
    return o;
}

static int lab03_experiment_a(lab_ctx *cx, lab03_exp_a *a) {
    int W = cx->world_size;
    memset(a, 0, sizeof *a);   /* the parallel state starts zeroed (init never reads it) */
    lab_heading(cx, "A. initialize_model_parallel on real communicators");
    lab_printf0("backend: %s (%s)\n", cx->backend.backend, cx->backend.backend_reason);

    a->plan_len = mc_grid_creation_plan(&cx->grid, NULL, 0);
    MC_CHECK(a->plan_len < 0 ? a->plan_len : MC_OK);
    a->plan = lab_xcalloc((size_t)a->plan_len, sizeof *a->plan);
    mc_grid_creation_plan(&cx->grid, a->plan, a->plan_len);

    int seq_before = cx->world->create_seq;
    lab_heap_stats heap0, heap1;
    lab_heap_stats_get(&heap0);
    double t0 = lab_now();
    mc_parallel_desc pd = {.world = cx->world, .grid = cx->grid.desc};
    MC_CHECK(mc_parallel_init(&a->ps, &pd));
    a->init_seconds = lab_now() - t0;
    lab_heap_stats_get(&heap1);
    a->heap_bytes = heap1.live_bytes - heap0.live_bytes;
    a->getters = lab_json_from_rank(
        cx, cx->me == cx->probe ? lab03_getters_json(cx, &a->ps) : NULL, cx->probe);

    int stride = lab03_rec_stride(W);
    int *rec = lab_xcalloc((size_t)MC_GROUP_COUNT * stride, sizeof *rec);
    int info[INFO_COUNT];
    memset(info, 0, sizeof info);
    lab03_collect_local(cx, a, rec, info);
    info[INFO_SEQ_DELTA] = cx->world->create_seq - seq_before;

    a->records = lab_xcalloc((size_t)W * MC_GROUP_COUNT * stride, sizeof *a->records);
    a->info = lab_xcalloc((size_t)W * INFO_COUNT, sizeof *a->info);
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
    lab_check(cx, a->verified, "every group's members match the plan");
    lab_check(cx, a->sequence_identical, "the creation sequence is the same on every rank");
    return LAB_RAN;
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
static int lab03_walk_step(lab_ctx *cx, mc_comm *parent, lab03_walk_mode mode,
                           const mc_plan_entry *e, int *call, double walk_start,
                           lab03_walk *w, int *planned, int *observed) {
    int W = cx->world_size;
    int n = mc_grid_group_members(&cx->grid, e->kind, e->index, planned, W);
    MC_CHECK(n < 0 ? n : MC_OK);
    int member = lab_ints_contain(planned, n, cx->me);
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

static void lab03_walk_plan(lab_ctx *cx, const lab03_exp_a *a, mc_comm *parent,
                            lab03_walk_mode mode, lab03_walk *w) {
    int W = cx->world_size;
    int *planned = lab_xcalloc((size_t)W, sizeof *planned);
    int *observed = lab_xcalloc((size_t)W, sizeof *observed);
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
    lab_format_ints(list, sizeof list, ranks, n);
    size_t len = strlen(list);
    if (len >= 2) list[len - 1] = '\0';
    snprintf(out, cap, "%s", list + 1);
}

static void lab03_describe_hang(const lab_ctx *cx, const int *all, lab03_walk_summary *s) {
    int W = cx->world_size;
    const int *r = lab03_walk_rec(all, s->rank, W);
    int *waiting = lab_xcalloc((size_t)W, sizeof(int));
    int *absent = lab_xcalloc((size_t)W, sizeof(int));
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
    int *planned = lab_xcalloc((size_t)W, sizeof(int));
    int n = mc_grid_group_members(&cx->grid, (mc_group_kind)r[W_KIND], r[W_GROUP], planned, W);
    lab_format_ints(planned_txt, sizeof planned_txt, planned, n < 0 ? 0 : n);
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

static void lab03_summarize_walk(const lab_ctx *cx, const int *all, const double *alld,
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
        int *planned = lab_xcalloc((size_t)W, sizeof(int));
        int n = mc_grid_group_members(&cx->grid, (mc_group_kind)r[W_KIND], r[W_GROUP],
                                      planned, W);
        char have[256], want[256];
        lab_format_ints(have, sizeof have, r + W_OBS, r[W_N_OBS]);
        lab_format_ints(want, sizeof want, planned, n < 0 ? 0 : n);
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
static mc_comm *lab03_copy_world(lab_ctx *cx, double timeout_s) {
    int W = cx->world_size;
    int *all = lab_xcalloc((size_t)W, sizeof *all);
    for (int i = 0; i < W; i++) all[i] = i;
    mc_comm *copy = NULL;
    MC_CHECK(mc_comm_create_group(cx->world, all, W, &copy));
    free(all);
    copy->timeout_s = timeout_s;   /* the watchdog for every call made over the copy */
    return copy;
}

static void lab03_run_walk(lab_ctx *cx, const lab03_exp_a *a, lab03_walk_mode mode,
                           double timeout_s, lab03_walk_summary *s) {
    int W = cx->world_size;
    memset(s, 0, sizeof *s);
    s->timeout_s = timeout_s;
    s->rank_outcomes = lab_xcalloc((size_t)W, sizeof(int));
    s->rank_calls = lab_xcalloc((size_t)W, sizeof(int));
    s->rank_skipped = lab_xcalloc((size_t)W, sizeof(int));

    mc_comm *copy = lab03_copy_world(cx, timeout_s);
    lab03_walk w;
    w.rec = lab_xcalloc((size_t)(W_OBS + W), sizeof(int));
    memset(w.d, 0, sizeof w.d);
    lab03_walk_plan(cx, a, copy, mode, &w);
    /* The copy is deliberately never destroyed: after a timeout it may hold an operation
       that will never complete, and freeing it under that operation is not allowed. */

    /* Meet again on the world (its own, longer timeout) and share the records. */
    int *all = lab_xcalloc((size_t)W * (size_t)(W_OBS + W), sizeof(int));
    double *alld = lab_xcalloc((size_t)W * WD_COUNT, sizeof(double));
    MC_CHECK(lab_all_gather_i32(cx->world, w.rec, all, (size_t)(W_OBS + W)));
    MC_CHECK(lab_all_gather_f64(cx->world, w.d, alld, WD_COUNT));
    lab03_summarize_walk(cx, all, alld, s);
    free(all);
    free(alld);
    free(w.rec);
}

static void lab03_print_walk(const lab_ctx *cx, const lab03_walk_summary *s) {
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

static int lab03_experiment_b(lab_ctx *cx, const lab03_exp_a *a, double timeout_s,
                               lab03_walk_summary *s) {
    lab_heading(cx, "B. only the members create each embedding group (the bug)");
    lab_printf0("same %d-call plan on a copy of the world; embedding groups paired by call "
                "position (verify=0) and called by members only; timeout %.1f s per call\n",
                a->plan_len, timeout_s);
    lab03_run_walk(cx, a, LAB03_WALK_BUG, timeout_s, s);
    lab03_print_walk(cx, s);
    return LAB_RAN;
}

static int lab03_experiment_c(lab_ctx *cx, const lab03_exp_a *a, double timeout_s,
                               lab03_walk_summary *s) {
    lab_heading(cx, "C. the same groups created member-locally");
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
    lab_check(cx, s->outcome == LAB03_OK, "member-local creation of the embedding groups works");
    return LAB_RAN;
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

static int lab03_plan_check_run(lab_ctx *cx, lab03_plan_check *pc) {
    memset(pc, 0, sizeof *pc);
    int W = cx->world_size;
    lab_heading(cx, "Plan check: one rank disagrees about the plan");
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

    int *codes = lab_xcalloc((size_t)W, sizeof(int));
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
    lab_check(cx, pc->outcome == LAB03_ERROR,
              "the plan check refuses a rank that plans other groups");
    return LAB_RAN;
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
static int lab03_followup_on_comms(lab_ctx *cx, lab03_followup *f) {
    mc_parallel_state fps;
    memset(&fps, 0, sizeof fps);   /* the struct init writes (it never reads it) */
    mc_parallel_desc pd = {.world = cx->world, .grid = f->grid.desc};
    MC_CHECK(mc_parallel_init(&fps, &pd));
    int W = cx->world_size;
    int *planned = lab_xcalloc((size_t)W, sizeof(int));
    int *observed = lab_xcalloc((size_t)W, sizeof(int));
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

static int lab03_followup_run(lab_ctx *cx, lab03_followup *f) {
    memset(f, 0, sizeof *f);
    f->spec = &lab03_variants[cx->variant - 1];
    lab_heading(cx, "Follow-up M003-F%d: %s", cx->variant, f->spec->what);
    mc_grid_desc d = {.world = f->spec->world, .tp = f->spec->tp, .cp = f->spec->cp,
                      .pp = f->spec->pp, .order = f->spec->order};
    f->grid_status = mc_grid_init(&f->grid, &d);
    if (f->grid_status != MC_OK) {
        snprintf(f->grid_error, sizeof f->grid_error, "%s", mc_last_error());
        lab_printf0("the rank grid refused the variant: %s\n", f->grid_error);
        return LAB_RAN;
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
    if (f->built) {
        lab_printf0("built on this run's %d ranks with mc_parallel_init: membership %s\n",
                    cx->world_size, f->verified ? "verified" : "MISMATCH");
        lab_check(cx, f->verified, "the follow-up variant's groups match its plan");
    } else
        lab_printf0("world %d differs from this run's %d ranks: groups from the rank grid only"
                    " (mpirun -np %d to build them)\n",
                    f->spec->world, cx->world_size, f->spec->world);
    return LAB_RAN;
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

static double lab03_time_one(lab_ctx *cx, mc_comm *g, void *send, void *recv, size_t count) {
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

static int lab03_timing_run(lab_ctx *cx, lab03_exp_a *a, lab03_timing *t) {
    memset(t, 0, sizeof *t);
    lab_heading(cx, "Timing: all-reduce in the TP, DP and PP groups");
    /* 64 MiB as in the lab text on GPUs; 4 MiB keeps 8 CPU ranks on 2 cores quick. */
    t->bytes = cx->world->backend == MC_BACKEND_NCCL ? (size_t)64 << 20 : (size_t)4 << 20;
    size_t count = t->bytes / sizeof(float);
    float *host = lab_xcalloc(count, sizeof(float));
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
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   results/lab03.json (the contract the grader reads) */

static cJSON *lab03_layout_json(const lab_ctx *cx, const lab03_layout *l, int kind) {
    cJSON *arr = cJSON_CreateArray();
    for (int g = 0; g < l->n_groups[kind]; g++)
        cJSON_AddItemToArray(arr, lab_json_int_array(l->members[kind] + (size_t)g * cx->world_size,
                                                     l->sizes[kind][g]));
    return arr;
}

static cJSON *lab03_probe_json(const lab_ctx *cx, const lab03_exp_a *a) {
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

static cJSON *lab03_walk_json(const lab_ctx *cx, const lab03_walk_summary *s) {
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
    cJSON_AddNumberToObject(o, "seconds", lab_round_s(s->seconds));
    cJSON_AddNumberToObject(o, "timeout_seconds", s->timeout_s);
    cJSON_AddNumberToObject(o, "walk_seconds", lab_round_s(s->walk_seconds));
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
    cJSON_AddNumberToObject(o, "seconds", lab_round_s(pc->seconds));
    cJSON_AddStringToObject(o, "message", pc->message);
    cJSON_AddStringToObject(o, "status", mc_err_name(pc->status0));
    cJSON_AddBoolToObject(o, "every_rank_refused", pc->all_mismatch);
    if (pc->used_salt)
        cJSON_AddStringToObject(o, "odd_rank_change", "plan_salt");
    else
        cJSON_AddStringToObject(o, "odd_rank_order", pc->odd_order);
    return o;
}

static cJSON *lab03_followup_json(const lab_ctx *cx, const lab03_followup *f) {
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
                              lab_json_grid_groups(g, (mc_group_kind)k));
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
        cJSON_AddItemToObject(p, pg[i].key,
                              lab_json_grid_group_of(g, (mc_group_kind)pg[i].kind, f->probe));
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
    cJSON_AddNumberToObject(o, "tp_ms", lab_round_ms(t->ms[0]));
    cJSON_AddNumberToObject(o, "dp_ms", lab_round_ms(t->ms[1]));
    cJSON_AddNumberToObject(o, "pp_ms", lab_round_ms(t->ms[2]));
    cJSON_AddNumberToObject(o, "tp_size", t->size[0]);
    cJSON_AddNumberToObject(o, "dp_size", t->size[1]);
    cJSON_AddNumberToObject(o, "pp_size", t->size[2]);
    cJSON_AddNumberToObject(o, "repeats", LAB03_TIMING_REPEATS);
    cJSON_AddStringToObject(o, "statistic", "median over repeats of the slowest rank");
    return o;
}


/* ---------------------------------------------------------------------------------------------
   Experiment M: a tiny GPT built with mc_gpt_init on the parallel state of A. The parallel
   state only holds communicators; the model's sizes, the layer split over the pipeline and
   the tensor-parallel shards are decided when the model is built. */

typedef struct lab03_model {
    mc_gpt_config config;
    int status;                    /* mc_gpt_init's (the same on every rank) */
    cJSON *probe;                  /* the probe rank's shard (all ranks) */
    int *holders;                  /* per layer: how many ranks hold it */
    int covered;                   /* every layer is held by world / pp ranks */
} lab03_model;

/* Layers divisible by PP (x VPP), heads by TP; the rest small enough for 2 cores. */
static mc_gpt_config lab03_model_config(const lab_ctx *cx) {
    const mc_grid_desc *d = &cx->grid.desc;
    int stages = d->pp * (d->vpp > 0 ? d->vpp : 1);
    int heads = 4 % d->tp == 0 ? 4 : d->tp;
    return (mc_gpt_config){
        .num_layers = stages >= 2 ? stages : 2, .hidden_size = 16 * heads,
        .num_attention_heads = heads, .vocab_size = 64, .seq_length = 8, .micro_batch_size = 1,
        .tensor_model_parallel_size = d->tp, .pipeline_model_parallel_size = d->pp,
        .virtual_pipeline_model_parallel_size = d->vpp, .seed = 1234};
}

/* This rank's shard: the layers it holds (flags[l] set), its tensors, and the shapes of the
   first layer's weights and of the embedding / output it holds (local vs global). */
static cJSON *lab03_shard_json(const lab_ctx *cx, const mc_gpt *g, int *flags) {
    cJSON *o = cJSON_CreateObject(), *layers = cJSON_CreateArray();
    cJSON *params = cJSON_CreateArray();
    long long elems = 0;
    int first = -1;
    for (int i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i];
        elems += (long long)p->numel;
        if (p->layer >= 0 && !flags[p->layer]) {
            flags[p->layer] = 1;
            cJSON_AddItemToArray(layers, cJSON_CreateNumber(p->layer));
            if (first < 0) first = p->layer;
        }
        if ((p->layer != first && p->layer != -1) || p->ndim != 2) continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", p->name);
        cJSON_AddItemToObject(e, "global_shape", lab_json_int_array(p->global_shape, 2));
        cJSON_AddItemToObject(e, "local_shape", lab_json_int_array(p->local_shape, 2));
        cJSON_AddItemToObject(e, "partition_dim", p->partition_dim >= 0
                                                      ? cJSON_CreateNumber(p->partition_dim)
                                                      : cJSON_CreateNull());
        cJSON_AddItemToArray(params, e);
    }
    cJSON_AddNumberToObject(o, "rank", cx->me);
    cJSON_AddNumberToObject(o, "pp_rank", g->pp_rank);
    cJSON_AddNumberToObject(o, "tp_rank", g->tp_rank);
    cJSON_AddItemToObject(o, "layers", layers);
    cJSON_AddBoolToObject(o, "pre_process", mc_gpt_is_pre_process(g, 0));
    cJSON_AddBoolToObject(o, "post_process", mc_gpt_is_post_process(g, g->n_chunks - 1));
    cJSON_AddNumberToObject(o, "param_tensors", g->table.count);
    cJSON_AddNumberToObject(o, "param_elements", (double)elems);
    cJSON_AddNumberToObject(o, "param_bytes", (double)elems * (double)sizeof(float));
    cJSON_AddItemToObject(o, "params", params);
    return o;
}

/* Every layer must sit on world / pp ranks (the TP x DP x CP replicas of its stage). */
static void lab03_count_holders(lab_ctx *cx, lab03_model *md, const int *flags) {
    int L = md->config.num_layers, W = cx->world_size;
    int *all = lab_xcalloc((size_t)L * (size_t)W, sizeof *all);
    MC_CHECK(lab_all_gather_i32(cx->world, flags, all, (size_t)L));
    md->holders = lab_xcalloc((size_t)L, sizeof *md->holders);
    md->covered = 1;
    for (int l = 0; l < L; l++) {
        for (int r = 0; r < W; r++) md->holders[l] += all[(size_t)r * L + l];
        if (md->holders[l] != W / cx->grid.desc.pp) md->covered = 0;
    }
    free(all);
}

static double lab03_num(const cJSON *o, const char *key) {
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, key));
}

static void lab03_print_model(const lab_ctx *cx, const lab03_model *md) {
    const cJSON *p = md->probe;
    char *layers = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(p, "layers"));
    lab_printf0("GPT: %d layers, hidden %d, %d heads; probe rank %d (pp_rank %.0f, tp_rank %.0f)"
                " holds layers %s%s%s: %.0f tensors, %.0f bytes of parameters\n",
                md->config.num_layers, md->config.hidden_size, md->config.num_attention_heads,
                cx->probe, lab03_num(p, "pp_rank"), lab03_num(p, "tp_rank"), layers,
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "pre_process")) ? " + embedding"
                                                                                 : "",
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "post_process")) ? " + output"
                                                                                  : "",
                lab03_num(p, "param_tensors"), lab03_num(p, "param_bytes"));
    free(layers);
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "params")) {
        char *g = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(e, "global_shape"));
        char *l = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(e, "local_shape"));
        lab_printf0("  %-52s global %-9s local %s\n",
                    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name")), g, l);
        free(g);
        free(l);
    }
    lab_printf0("heap the probe rank's calls left allocated: mc_parallel_init %.0f bytes, "
                "mc_gpt_init %.0f bytes; every layer on %d ranks (world / pp): %s\n",
                lab03_num(p, "parallel_state_heap_bytes"), lab03_num(p, "model_heap_bytes"),
                cx->world_size / cx->grid.desc.pp, md->covered ? "yes" : "NO");
}

static int lab03_experiment_model(lab_ctx *cx, const lab03_exp_a *a, lab03_model *md) {
    lab_heading(cx, "M. The model on top of the same parallel state");
    md->config = lab03_model_config(cx);
    int *flags = lab_xcalloc((size_t)md->config.num_layers, sizeof *flags);
    mc_gpt g;
    lab_heap_stats before, after;
    lab_heap_stats_get(&before);
    md->status = mc_gpt_init(&g, &(mc_gpt_desc){.config = md->config,
                                                 .ps = (mc_parallel_state *)&a->ps});
    lab_heap_stats_get(&after);
    cJSON *mine = NULL;
    if (md->status == MC_OK) {
        md->config = g.config;   /* resolved: padded vocabulary, ffn size */
        mine = lab03_shard_json(cx, &g, flags);
        cJSON_AddNumberToObject(mine, "parallel_state_heap_bytes", (double)a->heap_bytes);
        cJSON_AddNumberToObject(mine, "model_heap_bytes",
                                (double)(after.live_bytes - before.live_bytes));
        mc_gpt_free(&g);
    } else {   /* the config is the same on every rank: so is the verdict */
        lab_printf0("mc_gpt_init refused this layout (%s): %s\n", mc_err_name(md->status),
                    mc_last_error());
    }
    md->probe = lab_json_from_rank(cx, cx->me == cx->probe ? mine : (cJSON_Delete(mine), NULL),
                                   cx->probe);
    if (md->status == MC_OK) {
        lab03_count_holders(cx, md, flags);
        lab03_print_model(cx, md);
        lab_check(cx, md->covered, "every layer of the model is on world / pp ranks");
    }
    free(flags);
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   Experiment D (the follow-up): rank s (the probe) swaps the creation calls of its groups of
   two kinds. Run unverified, creation pairs callers by position (verify = 0, as
   torch.distributed.new_group): s ends up holding each of the two groups under the other's
   name, every call succeeds, and the all-reduces that follow (started on every group a rank
   holds, in plan order, then waited for, so no rank waits on another's order) return wrong
   sums. Run verified, the member-list check stops the first swapped call on every rank with
   MC_ERR_PLAN_MISMATCH naming both lists. */

static const int lab03_d_kinds[LAB03_N_VARIANTS][2] = {
    {MC_GROUP_TP, MC_GROUP_DP}, {MC_GROUP_DP, MC_GROUP_PP}, {MC_GROUP_TP, MC_GROUP_PP}};

enum { LAB03_D_MAX_WRONG = 64 };

typedef struct lab03_wrong {
    int rank, kind, got, expected;
} lab03_wrong;

typedef struct lab03_d_run {
    int outcome;
    int n_wrong;
    lab03_wrong wrong[LAB03_D_MAX_WRONG];
    int error_ranks, timeout_ranks, size_mismatches;
    int call_index;          /* first failing creation call, -1 if none */
    int status;              /* its status (rank 0's) */
    double seconds;          /* slowest rank: from the walk's start to its failure or end */
    char message[768];       /* rank 0's error message */
    char detail[768];
} lab03_d_run;

typedef struct lab03_exp_d {
    int swap_rank;
    int kinds[2], groups[2];           /* s's group of each kind */
    int calls[2];                      /* their plan positions */
    char lists[2][128];                /* their members */
    lab03_d_run unverified, verified;
} lab03_exp_d;

/* a rank's record, all-gathered: status, failing call, timeout, size mismatches, wrong sums */
enum { DR_STATUS, DR_CALL, DR_TIMEOUT, DR_SIZE_BAD, DR_N_WRONG, DR_WRONG };
#define LAB03_DR_LEN (DR_WRONG + 3 * MC_GROUP_COUNT)

static int lab03_planned_sum(const lab_ctx *cx, int kind, int *n_out) {
    int gi = -1, sum = 0;
    int *m = lab_xcalloc((size_t)cx->world_size, sizeof *m);
    mc_grid_group_of(&cx->grid, (mc_group_kind)kind, cx->me, &gi, NULL);
    int n = gi >= 0 ? mc_grid_group_members(&cx->grid, (mc_group_kind)kind, gi, m,
                                            cx->world_size)
                    : 0;
    for (int i = 0; i < n; i++) sum += m[i];
    free(m);
    *n_out = n;
    return sum;
}

/* Starts an all-reduce of this rank's world rank on every group it holds (plan order), then
   waits for each: the values each group really sums, whatever name the rank gave it. */
static void lab03_d_sums(lab_ctx *cx, const lab03_exp_a *a, mc_comm **held, int *rec) {
    int order[MC_GROUP_COUNT], n_order = 0, seen[MC_GROUP_COUNT] = {0};
    for (int i = 0; i < a->plan_len; i++)
        if (!seen[a->plan[i].kind]) {
            seen[a->plan[i].kind] = 1;
            order[n_order++] = (int)a->plan[i].kind;
        }
    mc_request *req[MC_GROUP_COUNT] = {0};
    void *buf[MC_GROUP_COUNT][2] = {{0}};
    for (int i = 0; i < n_order; i++) {
        mc_comm *c = held[order[i]];
        if (c == NULL) continue;
        buf[i][0] = mc_comm_alloc(c, sizeof(int));
        buf[i][1] = mc_comm_alloc(c, sizeof(int));
        if (buf[i][0] == NULL || buf[i][1] == NULL) MC_CHECK(MC_ERR_NO_MEMORY);
        MC_CHECK(mc_comm_upload(c, buf[i][0], &cx->me, sizeof(int)));
        MC_CHECK(mc_all_reduce_async(c, buf[i][0], buf[i][1], 1, MC_I32, MC_SUM, &req[i]));
    }
    for (int i = 0; i < n_order; i++) {
        mc_comm *c = held[order[i]];
        if (c == NULL) continue;
        int rc = mc_wait(req[i]), got = 0, n_planned = 0;
        if (rc != MC_OK) {   /* a timed-out operation may still write its buffers: keep them */
            rec[DR_STATUS] = rec[DR_STATUS] != MC_OK ? rec[DR_STATUS] : rc;
            rec[DR_TIMEOUT] |= rc == MC_ERR_TIMEOUT;
            continue;
        }
        MC_CHECK(mc_comm_download(c, &got, buf[i][1], sizeof got));
        mc_comm_free(c, buf[i][0]);
        mc_comm_free(c, buf[i][1]);
        int expected = lab03_planned_sum(cx, order[i], &n_planned);
        if (c->size != n_planned) rec[DR_SIZE_BAD]++;
        if (got != expected) {
            int *w = rec + DR_WRONG + 3 * rec[DR_N_WRONG]++;
            w[0] = order[i];
            w[1] = got;
            w[2] = expected;
        }
    }
}

static void lab03_d_summarize(const lab_ctx *cx, const int *all, lab03_d_run *out) {
    int W = cx->world_size;
    out->call_index = -1;
    for (int r = 0; r < W; r++) {
        const int *rec = all + (size_t)r * LAB03_DR_LEN;
        if (rec[DR_TIMEOUT]) out->timeout_ranks++;
        else if (rec[DR_STATUS] != MC_OK) out->error_ranks++;
        out->size_mismatches += rec[DR_SIZE_BAD];
        if (rec[DR_CALL] >= 0 && (out->call_index < 0 || rec[DR_CALL] < out->call_index))
            out->call_index = rec[DR_CALL];
        for (int k = 0; k < rec[DR_N_WRONG] && out->n_wrong < LAB03_D_MAX_WRONG; k++) {
            const int *w = rec + DR_WRONG + 3 * k;
            out->wrong[out->n_wrong++] = (lab03_wrong){r, w[0], w[1], w[2]};
        }
    }
    out->status = all[DR_STATUS];
    out->outcome = out->timeout_ranks      ? LAB03_HANG
                   : out->error_ranks      ? LAB03_ERROR
                   : out->size_mismatches  ? LAB03_WRONG_MEMBERSHIP
                   : out->n_wrong          ? LAB03_SILENT_WRONG
                                           : LAB03_OK;
    int failed = out->error_ranks + out->timeout_ranks;
    size_t len = 0;
    if (failed)
        len = (size_t)snprintf(out->detail, sizeof out->detail, "%d rank%s failed (%d timed out)",
                               failed, failed == 1 ? "" : "s", out->timeout_ranks);
    else
        len = (size_t)snprintf(out->detail, sizeof out->detail,
                               "every creation call and every all-reduce returned MC_OK");
    if (out->size_mismatches)
        len += (size_t)snprintf(out->detail + len, sizeof out->detail - len,
                                "; %d group handle%s of the wrong size", out->size_mismatches,
                                out->size_mismatches == 1 ? "" : "s");
    len += (size_t)snprintf(out->detail + len, sizeof out->detail - len,
                            "; %d all-reduce%s returned a wrong sum", out->n_wrong,
                            out->n_wrong == 1 ? "" : "s");
    for (int i = 0; i < out->n_wrong && len + 80 < sizeof out->detail; i++)
        len += (size_t)snprintf(out->detail + len, sizeof out->detail - len,
                                "%s rank %d %s got %d (expected %d)", i ? ";" : ":",
                                out->wrong[i].rank,
                                mc_group_kind_name((mc_group_kind)out->wrong[i].kind),
                                out->wrong[i].got, out->wrong[i].expected);
}

/* One run of D on a fresh copy of the world. */
static void lab03_d_walk(lab_ctx *cx, const lab03_exp_a *a, const lab03_exp_d *d, int verify,
                         lab03_d_run *out) {
    int W = cx->world_size, me = cx->me;
    memset(out, 0, sizeof *out);
    mc_comm *copy = lab03_copy_world(cx, cx->call_timeout_s);
    snprintf(copy->name, sizeof copy->name, "%s", verify ? "copy_d_verified" : "copy_d");
    mc_comm *held[MC_GROUP_COUNT] = {0};
    int *planned = lab_xcalloc((size_t)W, sizeof *planned);
    int rec[LAB03_DR_LEN] = {0};
    rec[DR_CALL] = -1;
    double t0 = lab_now();
    for (int idx = 0; idx < a->plan_len; idx++) {
        int kind = (int)a->plan[idx].kind, index = a->plan[idx].index;
        if (me == d->swap_rank && (idx == d->calls[0] || idx == d->calls[1])) {
            int other = idx == d->calls[0] ? 1 : 0;   /* the call of the other kind */
            kind = d->kinds[other];
            index = d->groups[other];
        }
        int n = mc_grid_group_members(&cx->grid, (mc_group_kind)kind, index, planned, W);
        mc_comm *child = NULL;
        int rc = mc_comm_create_group_ex(copy, planned, n, verify, &child);
        if (rc != MC_OK) {
            rec[DR_STATUS] = rc;
            rec[DR_CALL] = idx;
            rec[DR_TIMEOUT] = rc == MC_ERR_TIMEOUT;
            if (me == 0) snprintf(out->message, sizeof out->message, "%s", mc_last_error());
            break;
        }
        if (child != NULL) held[kind] = child;   /* kept as the group this rank asked for */
    }
    if (rec[DR_STATUS] == MC_OK) lab03_d_sums(cx, a, held, rec);
    double mine = lab_now() - t0;
    int *all = lab_xcalloc((size_t)W * LAB03_DR_LEN, sizeof *all);
    MC_CHECK(lab_all_gather_i32(cx->world, rec, all, LAB03_DR_LEN));
    MC_CHECK(lab_all_reduce_f64(cx->world, &mine, &out->seconds, 1, MC_MAX));
    lab03_d_summarize(cx, all, out);
    /* Nothing is pending unless a call timed out: then the communicators are left alone. */
    if (out->timeout_ranks == 0) {
        for (int k = 0; k < MC_GROUP_COUNT; k++) mc_comm_destroy(held[k]);
        mc_comm_destroy(copy);
    }
    free(all);
    free(planned);
}

/* The probe's groups of the variant's two kinds, and where the plan creates them. */
static void lab03_d_plan(lab_ctx *cx, const lab03_exp_a *a, lab03_exp_d *d) {
    int W = cx->world_size;
    int *m = lab_xcalloc((size_t)W, sizeof *m);
    d->swap_rank = cx->probe;
    for (int i = 0; i < 2; i++) {
        d->kinds[i] = lab03_d_kinds[cx->variant - 1][i];
        MC_CHECK(mc_grid_group_of(&cx->grid, (mc_group_kind)d->kinds[i], d->swap_rank,
                                  &d->groups[i], NULL));
        int n = mc_grid_group_members(&cx->grid, (mc_group_kind)d->kinds[i], d->groups[i], m, W);
        lab_format_ints(d->lists[i], sizeof d->lists[i], m, n);
        d->calls[i] = -1;
        for (int p = 0; p < a->plan_len; p++)
            if ((int)a->plan[p].kind == d->kinds[i] && a->plan[p].index == d->groups[i])
                d->calls[i] = p;
    }
    free(m);
}

static int lab03_experiment_d(lab_ctx *cx, const lab03_exp_a *a, lab03_exp_d *d) {
    memset(d, 0, sizeof *d);
    lab03_d_plan(cx, a, d);
    const char *ka = mc_group_kind_name((mc_group_kind)d->kinds[0]);
    const char *kb = mc_group_kind_name((mc_group_kind)d->kinds[1]);
    lab_heading(cx, "D. rank %d swaps the creation calls of its %s and %s groups (follow-up "
                    "M003-F%d)", d->swap_rank, ka, kb, cx->variant);
    lab_printf0("plan: call #%d creates %s[%d] = %s, call #%d creates %s[%d] = %s; rank %d "
                "makes each of the two calls with the other's members, every other rank "
                "follows the %d-call plan; then every rank all-reduces its world rank in each "
                "group it holds\n",
                d->calls[0], ka, d->groups[0], d->lists[0], d->calls[1], kb, d->groups[1],
                d->lists[1], d->swap_rank, a->plan_len);
    lab03_d_walk(cx, a, d, 0, &d->unverified);
    lab_printf0("unverified (paired by call position, verify=0): %s\n  %s\n",
                lab03_outcome_name(d->unverified.outcome), d->unverified.detail);
    lab03_d_walk(cx, a, d, 1, &d->verified);
    lab_printf0("verified (member lists compared, verify=1): %s",
                lab03_outcome_name(d->verified.outcome));
    if (d->verified.call_index >= 0)
        lab_printf0(" at call #%d after %.3f s (%s)", d->verified.call_index, d->verified.seconds,
                    mc_err_name(d->verified.status));
    lab_printf0("\n");
    if (d->verified.message[0]) lab_printf0("  rank 0: %s\n", d->verified.message);
    if (strcmp(d->lists[0], d->lists[1]) == 0) {   /* e.g. TP = DP = 1: nothing to swap */
        lab_printf0("  (both groups are %s in this layout: the swap changes no call)\n",
                    d->lists[0]);
        return LAB_RAN;
    }
    lab_check(cx, d->unverified.outcome != LAB03_OK,
              "the swapped creation calls show up when paired by position");
    lab_check(cx, d->verified.outcome == LAB03_ERROR && d->verified.status == MC_ERR_PLAN_MISMATCH,
              "the member-list check refuses the swapped calls");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   Destroy: mc_parallel_destroy, watched through the driver's allocator: the handles (the
   mc_comm structs) of the groups as they are freed, and the heap given back. */

typedef struct lab03_destroy {
    int reverse, released;         /* on every rank: reverse creation order; all given back */
    cJSON *probe;                  /* the probe rank's record (all ranks) */
} lab03_destroy;

typedef struct lab03_watch {
    mc_comm *handles[MC_GROUP_COUNT];
    int order[MC_GROUP_COUNT], n;  /* kinds, in the order their handles were freed */
} lab03_watch;

static void lab03_on_free(void *ptr, void *user) {
    lab03_watch *w = user;
    for (int k = 0; k < MC_GROUP_COUNT; k++)
        if (ptr != NULL && ptr == w->handles[k]) {
            w->order[w->n++] = k;
            w->handles[k] = NULL;
        }
}

static int lab03_experiment_destroy(lab_ctx *cx, lab03_exp_a *a, lab03_destroy *ds) {
    lab_heading(cx, "Destroy: mc_parallel_destroy");
    lab03_watch w;
    memset(&w, 0, sizeof w);
    int expected[MC_GROUP_COUNT], held = 0, seen[MC_GROUP_COUNT] = {0};
    for (int i = a->plan_len - 1; i >= 0; i--) {   /* kinds in reverse creation order */
        int k = (int)a->plan[i].kind;
        if (seen[k]++) continue;
        w.handles[k] = mc_parallel_group(&a->ps, (mc_group_kind)k);
        if (w.handles[k] != NULL) expected[held++] = k;
    }
    lab_heap_stats before, after;
    lab_heap_stats_get(&before);
    lab_heap_watch_frees(lab03_on_free, &w);
    MC_CHECK(mc_parallel_destroy(&a->ps));
    lab_heap_watch_frees(NULL, NULL);
    lab_heap_stats_get(&after);
    a->destroyed = 1;
    int nulls = 1;
    for (int k = 0; k < MC_GROUP_COUNT; k++)
        nulls &= mc_parallel_group(&a->ps, (mc_group_kind)k) == NULL;
    long long freed = before.live_bytes - after.live_bytes;
    int ok[2] = {w.n == held && memcmp(w.order, expected, sizeof(int) * (size_t)held) == 0,
                 w.n == held && nulls && freed == a->heap_bytes};
    int all[2] = {0, 0};
    MC_CHECK(lab_all_reduce_i32(cx->world, ok, all, 2, MC_MIN));
    ds->reverse = all[0];
    ds->released = all[1];
    cJSON *mine = NULL;
    if (cx->me == cx->probe) {
        mine = cJSON_CreateObject();
        cJSON_AddNumberToObject(mine, "rank", cx->me);
        cJSON_AddNumberToObject(mine, "groups_held", held);
        cJSON_AddNumberToObject(mine, "groups_destroyed", w.n);
        cJSON *order = cJSON_AddArrayToObject(mine, "order");
        for (int i = 0; i < w.n; i++)
            cJSON_AddItemToArray(order, cJSON_CreateString(mc_group_kind_name(w.order[i])));
        cJSON_AddNumberToObject(mine, "heap_bytes_released", (double)freed);
    }
    ds->probe = lab_json_from_rank(cx, mine, cx->probe);
    char *order = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(ds->probe, "order"));
    lab_printf0("probe rank %d released %.0f of its %.0f group handles, in the order %s\n",
                cx->probe, lab03_num(ds->probe, "groups_destroyed"),
                lab03_num(ds->probe, "groups_held"), order);
    lab_printf0("reverse of the creation order on every rank: %s; every getter returns NULL "
                "and the heap mc_parallel_init took is back on every rank: %s\n",
                ds->reverse ? "yes" : "NO", ds->released ? "yes" : "NO");
    free(order);
    lab_check(cx, ds->reverse, "groups are destroyed in reverse creation order");
    lab_check(cx, ds->released, "mc_parallel_destroy releases every handle");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   results/lab03.json "facts": the parts of M, D and destroy */

static cJSON *lab03_model_json(const lab03_model *md) {
    cJSON *o = cJSON_CreateObject();
    cJSON *c = cJSON_AddObjectToObject(o, "config");
    cJSON_AddNumberToObject(c, "num_layers", md->config.num_layers);
    cJSON_AddNumberToObject(c, "hidden_size", md->config.hidden_size);
    cJSON_AddNumberToObject(c, "num_attention_heads", md->config.num_attention_heads);
    cJSON_AddNumberToObject(c, "ffn_hidden_size", md->config.ffn_hidden_size);
    cJSON_AddNumberToObject(c, "vocab_size", md->config.vocab_size);
    cJSON_AddBoolToObject(o, "built", md->status == MC_OK);
    if (md->status != MC_OK || md->probe == NULL) return o;
    cJSON_AddItemToObject(o, "probe", cJSON_Duplicate(md->probe, 1));
    cJSON_AddItemToObject(o, "layer_holders",
                          lab_json_int_array(md->holders, md->config.num_layers));
    cJSON_AddBoolToObject(o, "every_layer_on_world_over_pp_ranks", md->covered);
    /* measured on the probe rank: what each call left on the library's heap */
    double ps_bytes = lab03_num(md->probe, "parallel_state_heap_bytes");
    double params = lab03_num(md->probe, "param_bytes");
    cJSON_AddNumberToObject(o, "parallel_state_heap_bytes", ps_bytes);
    cJSON_AddNumberToObject(o, "param_bytes_before_model_init", 0);
    cJSON_AddNumberToObject(o, "param_bytes_after_model_init", params);
    cJSON_AddNumberToObject(o, "model_init_heap_bytes", lab03_num(md->probe, "model_heap_bytes"));
    cJSON_AddBoolToObject(o, "parallel_state_allocates_params", ps_bytes >= params);
    return o;
}

static cJSON *lab03_d_run_json(const lab03_d_run *r, int verified) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", lab03_outcome_name(r->outcome));
    if (verified) {
        cJSON_AddItemToObject(o, "call_index", r->call_index >= 0
                                                   ? cJSON_CreateNumber(r->call_index)
                                                   : cJSON_CreateNull());
        cJSON_AddStringToObject(o, "status", r->call_index >= 0 ? mc_err_name(r->status) : "");
        cJSON_AddNumberToObject(o, "seconds", lab_round_s(r->seconds));
        cJSON_AddStringToObject(o, "message", r->message);
        return o;
    }
    cJSON *w = cJSON_AddArrayToObject(o, "wrong");
    for (int i = 0; i < r->n_wrong; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "rank", r->wrong[i].rank);
        cJSON_AddStringToObject(e, "kind", mc_group_kind_name((mc_group_kind)r->wrong[i].kind));
        cJSON_AddNumberToObject(e, "got", r->wrong[i].got);
        cJSON_AddNumberToObject(e, "expected", r->wrong[i].expected);
        cJSON_AddItemToArray(w, e);
    }
    cJSON_AddBoolToObject(o, "any_call_failed", r->error_ranks + r->timeout_ranks > 0);
    cJSON_AddBoolToObject(o, "any_call_timed_out", r->timeout_ranks > 0);
    cJSON_AddNumberToObject(o, "size_mismatches", r->size_mismatches);
    cJSON_AddStringToObject(o, "detail", r->detail);
    return o;
}

static cJSON *lab03_d_json(const lab_ctx *cx, const lab03_exp_d *d) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "variant", cx->variant_name);
    cJSON_AddNumberToObject(o, "swap_rank", d->swap_rank);
    cJSON *kinds = cJSON_AddArrayToObject(o, "kinds");
    cJSON *groups = cJSON_AddArrayToObject(o, "groups");
    for (int i = 0; i < 2; i++) {
        cJSON_AddItemToArray(kinds, cJSON_CreateString(mc_group_kind_name(d->kinds[i])));
        cJSON *list = cJSON_Parse(d->lists[i]);
        cJSON_AddItemToArray(groups, list != NULL ? list : cJSON_CreateNull());
    }
    cJSON_AddItemToObject(o, "swapped_calls", lab_json_int_array(d->calls, 2));
    cJSON_AddBoolToObject(o, "swap_changes_members", strcmp(d->lists[0], d->lists[1]) != 0);
    cJSON_AddItemToObject(o, "unverified", lab03_d_run_json(&d->unverified, 0));
    cJSON_AddItemToObject(o, "verified", lab03_d_run_json(&d->verified, 1));
    return o;
}

static cJSON *lab03_destroy_json(const lab03_destroy *ds) {
    cJSON *o = ds->probe != NULL ? cJSON_Duplicate(ds->probe, 1) : cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "reverse_of_creation", ds->reverse);
    cJSON_AddBoolToObject(o, "all_handles_released", ds->released);
    cJSON_AddStringToObject(o, "measured", "the library's frees of each group handle and its "
                                           "heap, through the lab's allocator, on every rank");
    return o;
}

static void lab03_walk_summary_free(lab03_walk_summary *s) {
    free(s->rank_outcomes);
    free(s->rank_calls);
    free(s->rank_skipped);
}

static const char lab03_summary[] =
    "lab03 (M003): builds every group of Megatron's initialize_model_parallel on real\n"
    "communicators, builds a tiny GPT on them, injects the \"only members create the group\"\n"
    "bug, repeats it with member-local creation, shows the plan fingerprint check, swaps two\n"
    "creation calls on one rank (with and without the check), destroys the groups, then\n"
    "grades answers/lab03.md. Defaults: TP=2, PP=2 on 8 ranks (DP derived).";

static const char lab03_specific[] =
    "\nlab03: --timeout sets the per-call watchdog of experiments B, C and D (default 5 s);\n"
    "       timing is on by default up to 8 ranks (--quick turns it off); LAB_VERBOSE=1\n"
    "       shows the library's log.\n";

/* ---------------------------------------------------------------------------------------------
   The lab: its state, the experiments as the driver calls them, the facts */

typedef struct lab03_state {
    lab03_exp_a a;
    lab03_model model;
    lab03_walk_summary b, c;
    lab03_plan_check plan;
    lab03_followup followup;
    lab03_exp_d d;
    lab03_timing timing;
    lab03_destroy destroy;
} lab03_state;

/* The experiments as the driver calls them (each records its own checks). */
#define LAB03_ST(cx) ((lab03_state *)(cx)->state)
static int lab03_run_a(lab_ctx *cx) { return lab03_experiment_a(cx, &LAB03_ST(cx)->a); }
static int lab03_run_model(lab_ctx *cx) {
    return lab03_experiment_model(cx, &LAB03_ST(cx)->a, &LAB03_ST(cx)->model);
}
static int lab03_run_b(lab_ctx *cx) {
    return lab03_experiment_b(cx, &LAB03_ST(cx)->a, cx->call_timeout_s, &LAB03_ST(cx)->b);
}
static int lab03_run_c(lab_ctx *cx) {
    return lab03_experiment_c(cx, &LAB03_ST(cx)->a, cx->call_timeout_s, &LAB03_ST(cx)->c);
}
static int lab03_run_plan_check(lab_ctx *cx) {
    return lab03_plan_check_run(cx, &LAB03_ST(cx)->plan);
}
static int lab03_run_followup(lab_ctx *cx) {
    return lab03_followup_run(cx, &LAB03_ST(cx)->followup);
}
static int lab03_run_d(lab_ctx *cx) {
    return lab03_experiment_d(cx, &LAB03_ST(cx)->a, &LAB03_ST(cx)->d);
}
static int lab03_run_destroy(lab_ctx *cx) {
    return lab03_experiment_destroy(cx, &LAB03_ST(cx)->a, &LAB03_ST(cx)->destroy);
}
/* on by default up to 8 ranks (2 cores share them), off with --quick or --no-timing */
static int lab03_run_timing(lab_ctx *cx) {
    int wanted = cx->args->timing >= 0 ? cx->args->timing : cx->world_size <= 8 && !cx->args->quick;
    return wanted ? lab03_timing_run(cx, &LAB03_ST(cx)->a, &LAB03_ST(cx)->timing) : LAB_SKIPPED;
}

static cJSON *lab03_facts(lab_ctx *cx) {
    const lab03_state *st = cx->state;
    const lab03_exp_a *a = &st->a;
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
    cJSON_AddItemToObject(f, "getters", a->getters != NULL ? cJSON_Duplicate(a->getters, 1)
                                                            : cJSON_CreateNull());
    cJSON_AddBoolToObject(f, "membership_verified", a->verified);
    cJSON_AddNumberToObject(f, "groups_created", a->plan_len);
    cJSON_AddNumberToObject(f, "init_seconds", lab_round_s(a->init_seconds));
    cJSON_AddItemToObject(f, "creation_sequence", lab03_sequence_json(a));
    cJSON_AddBoolToObject(f, "creation_sequence_identical", a->sequence_identical);
    /* measured on the world communicator's own creation counter, every rank */
    cJSON *calls = cJSON_AddObjectToObject(f, "world_creation_calls");
    cJSON_AddNumberToObject(calls, "min", a->world_calls_min);
    cJSON_AddNumberToObject(calls, "max", a->world_calls_max);
    cJSON_AddItemToObject(f, "model_shards", lab03_model_json(&st->model));
    cJSON_AddItemToObject(f, "exp_b", lab03_walk_json(cx, &st->b));
    cJSON_AddItemToObject(f, "exp_c", lab03_walk_json(cx, &st->c));
    cJSON_AddItemToObject(f, "plan_check", lab03_plan_check_json(&st->plan));
    cJSON_AddItemToObject(f, "followup", lab03_followup_json(cx, &st->followup));
    cJSON_AddItemToObject(f, "exp_d", lab03_d_json(cx, &st->d));
    cJSON_AddItemToObject(f, "timing", lab03_timing_json(&st->timing));
    cJSON_AddItemToObject(f, "destroy", lab03_destroy_json(&st->destroy));
    return f;
}

/* What was measured, printed before the score table. */
static void lab03_report(lab_ctx *cx) {
    const lab03_state *st = cx->state;
    const lab03_exp_a *a = &st->a;
    lab_printf0("\n== Measured ==\n");
    lab_printf0("dp_size %d; membership verified %s; %d groups created, sequence identical %s\n",
                cx->grid.dp, a->verified ? "yes" : "no", a->plan_len,
                a->sequence_identical ? "yes" : "no");
    lab_printf0("exp B %s, exp C %s, plan check %s; follow-up F%d dp_size %d%s\n",
                lab03_outcome_name(st->b.outcome), lab03_outcome_name(st->c.outcome),
                lab03_outcome_name(st->plan.outcome), cx->variant,
                st->followup.grid_status == MC_OK ? st->followup.grid.dp : -1,
                st->followup.built ? (st->followup.verified ? " (verified on communicators)"
                                                             : " (communicators MISMATCH)")
                                   : "");
    lab_printf0("exp D (rank %d swaps %s/%s): unverified %s, verified %s; groups destroyed in "
                "reverse order %s\n",
                st->d.swap_rank, mc_group_kind_name((mc_group_kind)st->d.kinds[0]),
                mc_group_kind_name((mc_group_kind)st->d.kinds[1]),
                lab03_outcome_name(st->d.unverified.outcome),
                lab03_outcome_name(st->d.verified.outcome),
                st->destroy.reverse ? "yes" : "no");
}

static void lab03_cleanup(lab_ctx *cx) {
    lab03_state *st = cx->state;
    lab03_exp_a *a = &st->a;
    if (!a->destroyed && a->ps.initialized) MC_CHECK(mc_parallel_destroy(&a->ps));
    free(a->plan);
    free(a->info);
    free(a->records);
    for (int k = 0; k < MC_GROUP_COUNT; k++) {
        free(a->layout.members[k]);
        free(a->layout.sizes[k]);
    }
    lab03_walk_summary_free(&st->b);
    lab03_walk_summary_free(&st->c);
    free(st->model.holders);
    cJSON_Delete(st->model.probe);
    cJSON_Delete(st->destroy.probe);
    cJSON_Delete(a->getters);
}

static const lab_experiment lab03_experiments[] = {
    {"A", lab03_run_a},
    {"M", lab03_run_model},
    {"B", lab03_run_b},
    {"C", lab03_run_c},
    {"plan_check", lab03_run_plan_check},
    {"followup", lab03_run_followup},
    {"D", lab03_run_d},
    {"timing", lab03_run_timing},
    {"destroy", lab03_run_destroy},
};

static const lab_spec lab03_spec = {
    .name = "lab03",
    .question = "M003",
    .title = "initialize_model_parallel",
    .summary = lab03_summary,
    .usage = lab03_specific,
    .default_world = 8,
    .sizes = {.tp = 2, .pp = 2},
    .call_timeout_s = 5.0,
    .n_variants = LAB03_N_VARIANTS,
    .experiments = lab03_experiments,
    .n_experiments = (int)(sizeof lab03_experiments / sizeof lab03_experiments[0]),
    .state_size = sizeof(lab03_state),
    .facts = lab03_facts,
    .report = lab03_report,
    .cleanup = lab03_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &lab03_spec); }
