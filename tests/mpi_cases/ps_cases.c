/* ps_cases - multi-rank checks of megatron_c's parallel state (initialize_model_parallel).

       mpirun -np N build/tests/ps_cases <case> [--tp T] [--pp P] [--cp C] [--ep E] [--etp X]
                                               [--vpp V] [--order S] [--variant order|salt]
                                               [--backend auto|self|mpi]

   Cases:
     init            mc_parallel_init, then for every group kind: the communicator's size is
                     the grid's group size, an all-reduce of world ranks equals the sum of the
                     planned members and an all-gather equals the member list in order; stage
                     predicates (every virtual stage), src ranks, pipeline neighbours; destroy;
                     init again after destroy, over a struct filled with 0xff garbage (init
                     never reads its output: the garbage's `initialized` must not matter).
     plan_mismatch   the last rank uses another order (--variant order, the default) or another
                     plan_salt (--variant salt): every rank must get MC_ERR_PLAN_MISMATCH within
                     10 s, and with a different order the message names the first differing
                     group; rank 0 prints its message. Then an agreed init must work.
     sizes_mismatch  the last rank passes another tp; same expectations.
     invalid_on_one_rank  the last rank's sizes fail validation: no rank waits for it.
   Rank 0 ends with "N passed, N failed"; the exit status is 0 iff every rank passed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#define DEFAULT_TIMEOUT_S mc_case_time_s(10.0)   /* also the watchdog */
#define MISMATCH_LIMIT_S 10.0   /* a plan disagreement must be reported this fast */

typedef struct options {
    mc_grid_desc grid;           /* world filled in from the communicator */
    char order[MC_ORDER_MAX];
    const char *variant;         /* plan_mismatch: "order" or "salt" */
    mc_comm_backend backend;
} options;

static mc_comm *world;
static int me, np;
static options opt;

/* ---------------------------------------------------------------------------------------------
   init */

static mc_parallel_desc base_desc(void) {
    mc_parallel_desc d = {.world = world, .grid = opt.grid};
    d.grid.world = 0;   /* zero means "the world's size" */
    return d;
}

/* The grid as this rank computes it without any communication: the reference. */
static int reference_grid(mc_grid *g, const mc_grid_desc *desc) {
    mc_grid_desc d = *desc;
    d.world = np;
    return mc_grid_init(g, &d);
}

/* Checks one group kind: the communicator against the grid's member list, through the wire. */
static void check_kind(const mc_parallel_state *ps, const mc_grid *g, mc_group_kind kind) {
    const char *name = mc_group_kind_name(kind);
    int index = -1, position = -1;
    int member = mc_grid_group_of(g, kind, me, &index, &position) == MC_OK;
    mc_comm *c = mc_parallel_group(ps, kind);
    if (!member) {
        MC_CASE_CHECK(c == NULL, "%s: rank %d is in no %s group but has a communicator", name,
                      me, name);
        MC_CASE_CHECK(mc_parallel_rank(ps, kind) == -1, "%s: mc_parallel_rank = %d, want -1",
                      name, mc_parallel_rank(ps, kind));
        MC_CASE_CHECK(mc_parallel_size(ps, kind) == 0, "%s: mc_parallel_size = %d, want 0",
                      name, mc_parallel_size(ps, kind));
        MC_CASE_CHECK(ps->group_index[kind] == -1, "%s: group_index = %d, want -1", name,
                      ps->group_index[kind]);
        return;
    }
    int members[512];
    int n = mc_grid_group_members(g, kind, index, members, 512);
    if (!MC_CASE_CHECK(n > 0, "%s: mc_grid_group_members(%d) = %d", name, index, n)) return;
    MC_CASE_CHECK(n == mc_grid_group_size(g, kind), "%s: %d members, grid group size %d", name,
                  n, mc_grid_group_size(g, kind));
    MC_CASE_CHECK(ps->group_index[kind] == index, "%s: group_index = %d, want %d", name,
                  ps->group_index[kind], index);
    MC_CASE_CHECK(mc_parallel_rank(ps, kind) == position, "%s: mc_parallel_rank = %d, want %d",
                  name, mc_parallel_rank(ps, kind), position);
    MC_CASE_CHECK(mc_parallel_size(ps, kind) == n, "%s: mc_parallel_size = %d, want %d", name,
                  mc_parallel_size(ps, kind), n);
    MC_CASE_CHECK(mc_parallel_src_rank(ps, kind) == members[0],
                  "%s: mc_parallel_src_rank = %d, want %d (first member)", name,
                  mc_parallel_src_rank(ps, kind), members[0]);
    char label[64];
    snprintf(label, sizeof label, "%s[%d]", name, index);
    mc_case_check_group(c, members, n, label);
}

/* Megatron's predicates: pp_rank first/last, and with an interleaved schedule also the first
   and last virtual stage, unless ignore_virtual. */
static int want_first(int pp_rank, int vp, int vpp, int ignore_virtual) {
    return pp_rank == 0 && (ignore_virtual || vpp <= 1 || vp == 0);
}

static int want_last(int pp_rank, int pp, int vp, int vpp, int ignore_virtual) {
    return pp_rank == pp - 1 && (ignore_virtual || vpp <= 1 || vp == vpp - 1);
}

static int want_in_embedding(const mc_grid *g, int vp, int ignore_virtual) {
    int index = -1;
    if (mc_grid_group_of(g, MC_GROUP_EMBEDDING, me, &index, NULL) != MC_OK) return 0;
    if (ignore_virtual) return 1;
    int members[512];
    int n = mc_grid_group_members(g, MC_GROUP_EMBEDDING, index, members, 512);
    mc_rank_coords rc;
    mc_grid_coords(g, me, &rc);
    int vpp = g->desc.vpp;
    if (members[0] == me) return want_first(rc.pp, vp, vpp, 0);
    if (members[n - 1] == me) return want_last(rc.pp, g->desc.pp, vp, vpp, 0);
    return 1;   /* a middle member counts on every virtual stage */
}

static void check_stages(mc_parallel_state *ps, const mc_grid *g) {
    int vpp = g->desc.vpp, pp = g->desc.pp, pp_rank = ps->coords.pp;
    int stages = vpp > 1 ? vpp : 1;
    for (int vp = 0; vp < stages; vp++) {
        ps->vp_stage = vp;
        for (int ignore = 0; ignore <= 1; ignore++) {
            int first = mc_parallel_is_first_stage(ps, ignore);
            int last = mc_parallel_is_last_stage(ps, ignore);
            int emb = mc_parallel_in_embedding_group(ps, ignore);
            MC_CASE_CHECK(first == want_first(pp_rank, vp, vpp, ignore),
                          "is_first_stage(ignore_virtual=%d) = %d at pp_rank %d vp_stage %d",
                          ignore, first, pp_rank, vp);
            MC_CASE_CHECK(last == want_last(pp_rank, pp, vp, vpp, ignore),
                          "is_last_stage(ignore_virtual=%d) = %d at pp_rank %d of %d, "
                          "vp_stage %d of %d", ignore, last, pp_rank, pp, vp, vpp);
            MC_CASE_CHECK(emb == want_in_embedding(g, vp, ignore),
                          "in_embedding_group(ignore_virtual=%d) = %d at vp_stage %d", ignore, emb,
                          vp);
        }
    }
    ps->vp_stage = 0;
}

static void check_pipeline_neighbours(const mc_grid *g) {
    int index = -1, pos = -1, members[512];
    if (mc_grid_group_of(g, MC_GROUP_PP, me, &index, &pos) != MC_OK) {
        MC_CASE_CHECK(0, "rank %d is in no pp group", me);
        return;
    }
    int n = mc_grid_group_members(g, MC_GROUP_PP, index, members, 512);
    int first = -1, last = -1, next = -1, prev = -1;
    int rc = mc_grid_pipeline_ranks(g, me, &first, &last, &next, &prev);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_grid_pipeline_ranks")) return;
    MC_CASE_CHECK(first == members[0] && last == members[n - 1] &&
                      next == members[(pos + 1) % n] && prev == members[(pos + n - 1) % n],
                  "pipeline ranks first %d last %d next %d prev %d, want %d %d %d %d (cyclic)",
                  first, last, next, prev, members[0], members[n - 1], members[(pos + 1) % n],
                  members[(pos + n - 1) % n]);
}

static void check_coords(const mc_parallel_state *ps, const mc_grid *g) {
    mc_rank_coords want;
    mc_grid_coords(g, me, &want);
    const mc_rank_coords *got = &ps->coords;
    MC_CASE_CHECK(got->rank == want.rank && got->tp == want.tp && got->cp == want.cp &&
                      got->dp == want.dp && got->pp == want.pp && got->etp == want.etp &&
                      got->ep == want.ep && got->edp == want.edp,
                  "coords (tp %d cp %d dp %d pp %d etp %d ep %d edp %d), "
                  "want (%d %d %d %d %d %d %d)",
                  got->tp, got->cp, got->dp, got->pp, got->etp, got->ep, got->edp, want.tp,
                  want.cp, want.dp, want.pp, want.etp, want.ep, want.edp);
}

static void check_state(mc_parallel_state *ps, const mc_grid *g, uint64_t salt) {
    MC_CASE_CHECK(ps->initialized, "initialized = 0 after mc_parallel_init");
    MC_CASE_CHECK(ps->world == world, "ps->world is not the world passed in");
    int planned = mc_grid_creation_plan(g, NULL, 0);
    MC_CASE_CHECK(ps->n_created == planned, "n_created = %d, the plan has %d entries",
                  ps->n_created, planned);
    MC_CASE_CHECK(ps->plan_fingerprint == mc_grid_plan_fingerprint(g, salt),
                  "plan_fingerprint %016llx, want %016llx",
                  (unsigned long long)ps->plan_fingerprint,
                  (unsigned long long)mc_grid_plan_fingerprint(g, salt));
    check_coords(ps, g);
    for (int k = 0; k < MC_GROUP_COUNT; k++) check_kind(ps, g, (mc_group_kind)k);
    check_stages(ps, g);
    check_pipeline_neighbours(g);
}

static void case_init(void) {
    mc_grid g;
    int rc = reference_grid(&g, &opt.grid);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_grid_init (reference)")) return;
    if (me == 0)
        printf("init: world %d tp %d pp %d cp %d ep %d etp %d vpp %d dp %d order %s\n", np,
               g.desc.tp, g.desc.pp, g.desc.cp, g.desc.ep, g.desc.etp, g.desc.vpp, g.dp, g.order);

    mc_parallel_desc desc = base_desc();
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    rc = mc_parallel_init(&ps, &desc);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_parallel_init")) return;
    check_state(&ps, &g, 0);

    rc = mc_parallel_destroy(&ps);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_parallel_destroy");
    MC_CASE_CHECK(!ps.initialized, "initialized = 1 after mc_parallel_destroy");
    MC_CASE_CHECK(mc_parallel_group(&ps, MC_GROUP_TP) == NULL,
                  "mc_parallel_group(tp) is not NULL after destroy");

    /* init again after destroy, over garbage and with a salt: everything is rebuilt */
    memset(&ps, 0xff, sizeof ps);
    desc.plan_salt = 0x5eed;
    rc = mc_parallel_init(&ps, &desc);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_parallel_init over a 0xff-filled state")) {
        check_state(&ps, &g, 0x5eed);
        MC_CASE_CHECK_STATUS(mc_parallel_destroy(&ps), MC_OK, "mc_parallel_destroy (second)");
    }
}

/* ---------------------------------------------------------------------------------------------
   plan_mismatch and sizes_mismatch: the last rank disagrees. */

/* The first plan entry whose members differ between two grids of the same shape; -1 if
   none. Writes its label ("pp[1]") and both member lists. */
static int first_difference(const mc_grid *a, const mc_grid *b, char *label, size_t label_cap,
                            char *list_a, char *list_b, size_t list_cap) {
    int n = mc_grid_creation_plan(a, NULL, 0);
    if (n != mc_grid_creation_plan(b, NULL, 0)) return -2;   /* shapes differ */
    mc_plan_entry *pa = calloc((size_t)n, sizeof *pa), *pb = calloc((size_t)n, sizeof *pb);
    mc_grid_creation_plan(a, pa, n);
    mc_grid_creation_plan(b, pb, n);
    int found = -1;
    int ma[512], mb[512];
    for (int k = 0; k < n && found < 0; k++) {
        int na = mc_grid_group_members(a, pa[k].kind, pa[k].index, ma, 512);
        int nb = mc_grid_group_members(b, pb[k].kind, pb[k].index, mb, 512);
        if (pa[k].kind == pb[k].kind && pa[k].index == pb[k].index && na == nb &&
            memcmp(ma, mb, sizeof(int) * (size_t)(na > 0 ? na : 0)) == 0)
            continue;
        found = k;
        snprintf(label, label_cap, "%s[%d]", mc_group_kind_name(pa[k].kind), pa[k].index);
        mc_case_format_ranks(list_a, list_cap, ma, na);
        mc_case_format_ranks(list_b, list_cap, mb, nb);
    }
    free(pa);
    free(pb);
    return found;
}

/* Runs mc_parallel_init with `mine` on this rank (the last rank passes the disagreeing desc)
   and checks the failure: status, speed, a message; returns 1 when init failed as it must. */
static int expect_plan_mismatch(const mc_parallel_desc *mine, const char *what) {
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    double t0 = mc_test_now();
    int rc = mc_parallel_init(&ps, mine);
    double elapsed = mc_test_now() - t0;
    MC_CASE_CHECK_STATUS(rc, MC_ERR_PLAN_MISMATCH, what);
    MC_CASE_CHECK(elapsed < MISMATCH_LIMIT_S, "%s: took %.2f s to fail (limit %.0f s)", what,
                  elapsed, MISMATCH_LIMIT_S);
    MC_CASE_CHECK(!ps.initialized, "%s: state marked initialised after a failure", what);
    if (rc == MC_OK) mc_parallel_destroy(&ps);
    if (me == 0) printf("%s: rank 0 got %s after %.2f s: %s\n", what, mc_err_name(rc), elapsed,
                        mc_last_error());
    return rc == MC_ERR_PLAN_MISMATCH;
}

/* After a refused plan the world must still agree on the next one. */
static void check_recovery(void) {
    mc_parallel_desc desc = base_desc();
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    int rc = mc_parallel_init(&ps, &desc);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_parallel_init agreed by all, after a mismatch"))
        return;
    mc_grid g;
    reference_grid(&g, &opt.grid);
    check_kind(&ps, &g, MC_GROUP_TP);
    check_kind(&ps, &g, MC_GROUP_DP);
    check_kind(&ps, &g, MC_GROUP_PP);
    MC_CASE_CHECK_STATUS(mc_parallel_destroy(&ps), MC_OK, "mc_parallel_destroy");
}

/* Swaps the last two axes of the order: a different plan of the same shape. */
static void other_order(const char *order, char *out, size_t cap) {
    char head[MC_ORDER_MAX], second[MC_ORDER_MAX], last[MC_ORDER_MAX];
    snprintf(head, sizeof head, "%s", order);
    char *cut = strrchr(head, '-');
    int len = -1;
    if (cut != NULL) {
        snprintf(last, sizeof last, "%s", cut + 1);
        *cut = '\0';
        char *before = strrchr(head, '-');
        if (before == NULL) {
            len = snprintf(out, cap, "%s-%s", last, head);
        } else {
            snprintf(second, sizeof second, "%s", before + 1);
            *before = '\0';
            len = snprintf(out, cap, "%s-%s-%s", head, last, second);
        }
    }
    if (len < 0 || (size_t)len >= cap) snprintf(out, cap, "%s", order);
}

static void case_plan_mismatch(void) {
    mc_grid base;
    if (!MC_CASE_CHECK_STATUS(reference_grid(&base, &opt.grid), MC_OK, "mc_grid_init")) return;
    mc_parallel_desc desc = base_desc();
    char order[MC_ORDER_MAX];
    int by_order = strcmp(opt.variant, "salt") != 0;
    mc_grid_desc variant_grid = opt.grid;
    if (by_order) {
        other_order(base.order, order, sizeof order);
        variant_grid.order = order;
    }
    if (me == np - 1) {
        if (by_order) desc.grid.order = order;
        else desc.plan_salt = 0xbadc0ffee;
    }
    char what[96];
    snprintf(what, sizeof what, "plan_mismatch (last rank: %s%s)",
             by_order ? "order=" : "plan_salt=0xbadc0ffee", by_order ? order : "");
    if (!expect_plan_mismatch(&desc, what)) {
        check_recovery();
        return;
    }
    char msg[2048];   /* a copy: later calls may replace the thread's last error */
    snprintf(msg, sizeof msg, "%s", mc_last_error());
    if (!by_order) {
        MC_CASE_CHECK(strstr(msg, "salt") != NULL, "the message must say the salts differ: \"%s\"",
                      msg);
        check_recovery();
        return;
    }
    char base_order[MC_ORDER_MAX + 8], variant_order[MC_ORDER_MAX + 8];
    snprintf(base_order, sizeof base_order, "order=%s", base.order);
    snprintf(variant_order, sizeof variant_order, "order=%s", order);
    MC_CASE_CHECK(strstr(msg, base_order) && strstr(msg, variant_order),
                  "the message must show both orders (%s, %s): \"%s\"", base_order,
                  variant_order, msg);
    mc_grid variant;
    if (MC_CASE_CHECK_STATUS(reference_grid(&variant, &variant_grid), MC_OK,
                             "mc_grid_init (variant order)")) {
        char label[64], list_base[256], list_variant[256];
        int k = first_difference(&base, &variant, label, sizeof label, list_base, list_variant,
                                 sizeof list_base);
        /* k < 0: both orders give the same groups (e.g. DP = 1); only the orders differ */
        if (k >= 0) {
            MC_CASE_CHECK(strstr(msg, label) != NULL,
                          "the message must name the first differing group %s (#%d): \"%s\"",
                          label, k, msg);
            MC_CASE_CHECK(strstr(msg, list_base) && strstr(msg, list_variant),
                          "the message must give both member lists %s and %s: \"%s\"",
                          list_base, list_variant, msg);
        }
    }
    check_recovery();
}

static void case_sizes_mismatch(void) {
    mc_grid base;
    if (!MC_CASE_CHECK_STATUS(reference_grid(&base, &opt.grid), MC_OK, "mc_grid_init")) return;
    mc_grid_desc other = opt.grid;
    int base_tp = opt.grid.tp > 0 ? opt.grid.tp : 1;
    other.tp = base_tp > 1 ? 1 : 2;
    mc_grid probe;
    if (reference_grid(&probe, &other) != MC_OK) {
        /* both sizes must be valid, or the odd rank fails alone and the others time out */
        if (me == 0) printf("sizes_mismatch: tp=%d does not fit this world\n", other.tp);
        MC_CASE_CHECK(0, "sizes_mismatch needs sizes where tp=%d is also valid", other.tp);
        return;
    }
    mc_parallel_desc desc = base_desc();
    if (me == np - 1) desc.grid.tp = other.tp;
    char what[64];
    snprintf(what, sizeof what, "sizes_mismatch (last rank: tp=%d)", other.tp);
    if (expect_plan_mismatch(&desc, what)) {
        char mine_tp[16], their_tp[16];
        snprintf(mine_tp, sizeof mine_tp, "tp=%d", me == np - 1 ? other.tp : base_tp);
        snprintf(their_tp, sizeof their_tp, "tp=%d", me == np - 1 ? base_tp : other.tp);
        const char *msg = mc_last_error();   /* read before any other library call */
        MC_CASE_CHECK(strstr(msg, mine_tp) && strstr(msg, their_tp),
                      "the message must show both sizes (%s, %s): \"%s\"", mine_tp, their_tp, msg);
    }
    check_recovery();
}

/* The last rank passes sizes that fail validation on their own (tp = 2 x world). It must
   get its own validation error and every other rank a plan mismatch naming it, at once. */
static void case_invalid_on_one_rank(void) {
    mc_parallel_desc desc = base_desc();
    if (me == np - 1) desc.grid.tp = 2 * np;
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    double t0 = mc_test_now();
    int rc = mc_parallel_init(&ps, &desc);
    double elapsed = mc_test_now() - t0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mc_last_error());
    if (me == np - 1) {
        MC_CASE_CHECK_STATUS(rc, MC_ERR_INVALID_DESC, "invalid_on_one_rank (the invalid rank)");
    } else {
        char who[32];
        snprintf(who, sizeof who, "rank %d", np - 1);
        MC_CASE_CHECK_STATUS(rc, MC_ERR_PLAN_MISMATCH, "invalid_on_one_rank (a valid rank)");
        MC_CASE_CHECK(strstr(msg, who) != NULL, "the message must name %s: \"%s\"", who, msg);
    }
    MC_CASE_CHECK(elapsed < MISMATCH_LIMIT_S, "invalid_on_one_rank: took %.2f s (limit %.0f s)",
                  elapsed, MISMATCH_LIMIT_S);
    if (rc == MC_OK) mc_parallel_destroy(&ps);
    if (me == 0) printf("invalid_on_one_rank: rank 0 got %s after %.2f s: %s\n", mc_err_name(rc),
                        elapsed, msg);
    check_recovery();
}

/* ---------------------------------------------------------------------------------------------
   argument parsing and dispatch */

typedef struct ps_case {
    const char *name;
    int min_ranks;
    void (*run)(void);
} ps_case;

static const ps_case cases[] = {
    {"init", 1, case_init},
    {"plan_mismatch", 2, case_plan_mismatch},
    {"sizes_mismatch", 2, case_sizes_mismatch},
    {"invalid_on_one_rank", 2, case_invalid_on_one_rank},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s <init|plan_mismatch|sizes_mismatch|invalid_on_one_rank> [--tp T] [--pp P] [--cp C] [--ep E]\n"
            "       [--etp X] [--vpp V] [--order S] [--variant order|salt] "
            "[--backend auto|self|mpi]\n",
            prog);
}

static int int_option(const char *name, int *field, const char *flag, const char *value) {
    if (strcmp(flag, name) != 0) return 0;
    char *end = NULL;
    long v = strtol(value, &end, 10);
    if (end == value || *end != '\0' || v < 0 || v > MC_MAX_RANKS) return -1;
    *field = (int)v;
    return 1;
}

/* Returns 1 when every option was understood. */
static int parse_options(int argc, char **argv) {
    opt.variant = "order";
    opt.backend = MC_BACKEND_AUTO;
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc) return 0;
        const char *flag = argv[i], *value = argv[i + 1];
        int used = int_option("--tp", &opt.grid.tp, flag, value) |
                   int_option("--pp", &opt.grid.pp, flag, value) |
                   int_option("--cp", &opt.grid.cp, flag, value) |
                   int_option("--ep", &opt.grid.ep, flag, value) |
                   int_option("--etp", &opt.grid.etp, flag, value) |
                   int_option("--vpp", &opt.grid.vpp, flag, value);
        if (used < 0) return 0;
        if (!used && strcmp(flag, "--order") == 0) {
            snprintf(opt.order, sizeof opt.order, "%s", value);
            opt.grid.order = opt.order;
            used = 1;
        }
        if (!used && strcmp(flag, "--variant") == 0) {
            if (strcmp(value, "order") != 0 && strcmp(value, "salt") != 0) return 0;
            opt.variant = value;
            used = 1;
        }
        if (!used && strcmp(flag, "--backend") == 0) {
            if (!mc_case_backend_option(value, &opt.backend)) return 0;
            used = 1;
        }
        if (!used) return 0;
        i++;
    }
    return 1;
}

int main(int argc, char **argv) {
    const ps_case *chosen = NULL;
    for (int i = 0; argc >= 2 && i < N_CASES; i++)
        if (strcmp(argv[1], cases[i].name) == 0) chosen = &cases[i];
    if (chosen == NULL || !parse_options(argc, argv)) {
        usage(argv[0]);
        return 2;
    }
    int rc = mc_case_init_world(&world, &(mc_comm_desc){.backend = opt.backend,
                                                         .timeout_s = DEFAULT_TIMEOUT_S, .watchdog_s = DEFAULT_TIMEOUT_S,
                                                         .argc = &argc, .argv = &argv});
    if (rc != MC_OK) return 1;
    me = world->rank;
    np = world->size;
    return mc_case_run(world, chosen->name, chosen->run,
                       np < chosen->min_ranks ? "needs 2 ranks" : NULL);
}
