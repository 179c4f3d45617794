/* labs/lab04.c - M004: deriving DP, TP, PP and CP from the GPU count; why EP does not multiply.

       make lab04 && mpirun --oversubscribe -np 8 ./lab04      (as root add --allow-run-as-root)

   The experiments, in order (rank 0 prints, every rank takes part; the driver, lab_driver.h,
   does the answer sheet, the results envelope and the grading around them):
     A. the 64-GPU layout TP=4, PP=4, CP=2 from the rank generator alone (no communication):
        DP; then the follow-up's EP (8, or 4 in one variant) with ETP left at its default
        (= TP: refused when ETP x EP x PP does not divide 64) and with the variant's ETP; the
        probe rank's dense and expert coordinates and groups, and both grids of every rank
        checked against coordinates decoded here and groups defined here as "the ranks that
        agree on every other coordinate"; a figure of the probe's stage (dense DP x CP groups
        beside expert-DP groups);
     B. a real run on this world (default 8 ranks: TP=2, CP=2, EP=2, ETP=1, so DP=2): every
        rank holds one dense parameter and one expert parameter whose gradient is the one-hot
        vector of its rank id; the library's DDP layer reduces the dense table over DP x CP
        (MC_GROUP_DP_CP) and the expert table over expert-DP (MC_GROUP_EXPERT_DP, scaled by
        1/(DP x CP) as Megatron does). Each rank reads back which ranks' gradients reached its
        own and with what weight; the sets are compared with the rank grid's groups. The same
        expert gradients are also reduced over the dense DP x CP group, to see whether that
        group would average different experts together;
     C. the same world with the other ETP (TP when the run has ETP = 1, else 1): EDP, the
        expert-DP groups and the same three reductions. At the default sizes the expert-DP
        groups of B have the same members as the dense DP x CP groups; in C they do not, and
        the dense group would average two different experts.

   The gradients are exact in fp32 (one-hot entries times 1/(DP x CP)), so a contributor is an
   entry that is not zero and its weight says how often and how it was counted. */
#include "lab_driver.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LAB04_N_VARIANTS 3
#define LAB04_BIG_WORLD 64
#define LAB04_MAX_WORLD 64
#define LAB04_PRINT_ALL_RANKS 16   /* print every rank of the run up to this world */
#define LAB04_REDUCTION_PATH "mc_ddp"  /* every gradient goes through the library's DDP layer, on the world's memory */

/* The follow-up: TP4 PP4 CP2 on 64 GPUs, and the expert sizes each variant adds. */
static const mc_grid_desc lab04_big = {.world = LAB04_BIG_WORLD, .tp = 4, .pp = 4, .cp = 2};
static const struct { int ep, etp; } lab04_variants[LAB04_N_VARIANTS] = {{8, 1}, {8, 2}, {4, 2}};

/* ---------------------------------------------------------------------------------------------
   The independent reference: coordinates decoded from the order string as a mixed-radix
   number (leftmost axis fastest), and a group defined as the ranks that share every
   coordinate outside the group's axes. Nothing here calls the rank generator. */

enum { AX_TP, AX_CP, AX_EP, AX_DP, AX_PP, AX_N };
static const char *const lab04_axis_names[AX_N] = {"tp", "cp", "ep", "dp", "pp"};
#define BIT(a) (1u << (a))

typedef struct lab04_coords {
    int dense[AX_N];    /* tp cp ep(=0) dp pp */
    int expert[AX_N];   /* etp cp(=0) ep edp pp */
} lab04_coords;

/* size of each axis in the dense and in the expert grid */
static void lab04_axis_sizes(const mc_grid *g, int expert, int *size) {
    const mc_grid_desc *d = &g->desc;
    size[AX_TP] = expert ? d->etp : d->tp;
    size[AX_CP] = expert ? 1 : d->cp;
    size[AX_EP] = expert ? d->ep : 1;
    size[AX_DP] = expert ? g->edp : g->dp;
    size[AX_PP] = d->pp;
}

/* rank -> coordinates, reading the resolved order ("tp-cp-ep-dp-pp") token by token */
static void lab04_decode(const mc_grid *g, int expert, int rank, int *coord) {
    int size[AX_N], rest = rank;
    lab04_axis_sizes(g, expert, size);
    for (int a = 0; a < AX_N; a++) coord[a] = 0;
    for (const char *p = g->order; *p != '\0';) {
        for (int a = 0; a < AX_N; a++)
            if (strncmp(p, lab04_axis_names[a], 2) == 0) {
                coord[a] = rest % size[a];
                rest /= size[a];
            }
        p += p[2] == '-' ? 3 : 2;
    }
}

static lab04_coords *lab04_decode_all(const mc_grid *g) {
    int W = g->desc.world;
    lab04_coords *all = lab_xcalloc((size_t)W, sizeof *all);
    for (int r = 0; r < W; r++) {
        lab04_decode(g, 0, r, all[r].dense);
        lab04_decode(g, 1, r, all[r].expert);
    }
    return all;
}

/* The ranks that agree with `rank` on every axis outside `vary` (ascending). */
static int lab04_defined_group(const lab04_coords *all, int W, int rank, unsigned vary,
                               int expert, int *out) {
    int n = 0;
    for (int s = 0; s < W; s++) {
        const int *a = expert ? all[s].expert : all[s].dense;
        const int *b = expert ? all[rank].expert : all[rank].dense;
        int same = 1;
        for (int ax = 0; ax < AX_N && same; ax++)
            if (!(vary & BIT(ax)) && a[ax] != b[ax]) same = 0;
        if (same) out[n++] = s;
    }
    return n;
}

/* The group kinds the lab looks at, with the axes each one varies. */
typedef struct lab04_kind {
    mc_group_kind kind;
    unsigned vary;
    int expert;
} lab04_kind;
static const lab04_kind lab04_kinds[] = {
    {MC_GROUP_TP, BIT(AX_TP), 0},        {MC_GROUP_CP, BIT(AX_CP), 0},
    {MC_GROUP_DP, BIT(AX_DP), 0},        {MC_GROUP_DP_CP, BIT(AX_DP) | BIT(AX_CP), 0},
    {MC_GROUP_PP, BIT(AX_PP), 0},        {MC_GROUP_EP, BIT(AX_EP), 1},
    {MC_GROUP_EXPERT_TP, BIT(AX_TP), 1}, {MC_GROUP_EXPERT_DP, BIT(AX_DP), 1},
};
#define LAB04_N_KINDS ((int)(sizeof lab04_kinds / sizeof lab04_kinds[0]))

/* The members of `rank`'s group of `kind` from the rank generator; returns the count. */
static int lab04_grid_group(const mc_grid *g, mc_group_kind kind, int rank, int *out) {
    int gi = -1;
    MC_CHECK(mc_grid_group_of(g, kind, rank, &gi, NULL));
    int n = mc_grid_group_members(g, kind, gi, out, g->desc.world);
    MC_CHECK(n < 0 ? n : MC_OK);
    return n;
}

/* Every rank's coordinates and its groups of every kind above: the generator against the
   reference. Returns the number of disagreements (0 when they agree). */
static int lab04_compare_grid(const mc_grid *g, const lab04_coords *all) {
    int W = g->desc.world, bad = 0;
    int *a = lab_xcalloc((size_t)W, sizeof(int)), *b = lab_xcalloc((size_t)W, sizeof(int));
    for (int r = 0; r < W; r++) {
        mc_rank_coords c;
        MC_CHECK(mc_grid_coords(g, r, &c));
        const int *d = all[r].dense, *e = all[r].expert;
        bad += c.tp != d[AX_TP] || c.cp != d[AX_CP] || c.dp != d[AX_DP] || c.pp != d[AX_PP];
        bad += c.etp != e[AX_TP] || c.ep != e[AX_EP] || c.edp != e[AX_DP] || c.pp != e[AX_PP];
        for (int k = 0; k < LAB04_N_KINDS; k++) {
            int na = lab04_grid_group(g, lab04_kinds[k].kind, r, a);
            int nb = lab04_defined_group(all, W, r, lab04_kinds[k].vary, lab04_kinds[k].expert, b);
            bad += !lab_ints_same_set(a, na, b, nb);
        }
    }
    free(a);
    free(b);
    return bad;
}

/* ---------------------------------------------------------------------------------------------
   Small JSON and printing helpers */

static cJSON *lab04_coords_json(const mc_rank_coords *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", c->rank);
    cJSON_AddNumberToObject(o, "tp_rank", c->tp);
    cJSON_AddNumberToObject(o, "cp_rank", c->cp);
    cJSON_AddNumberToObject(o, "dp_rank", c->dp);
    cJSON_AddNumberToObject(o, "pp_rank", c->pp);
    cJSON_AddNumberToObject(o, "etp_rank", c->etp);
    cJSON_AddNumberToObject(o, "ep_rank", c->ep);
    cJSON_AddNumberToObject(o, "edp_rank", c->edp);
    return o;
}

/* {"tp": [..], "cp": [..], ...}: `rank`'s group of every kind the lab looks at */
static cJSON *lab04_groups_of_json(const mc_grid *g, int rank) {
    cJSON *o = cJSON_CreateObject();
    for (int k = 0; k < LAB04_N_KINDS; k++)
        cJSON_AddItemToObject(o, mc_group_kind_name(lab04_kinds[k].kind),
                              lab_json_grid_group_of(g, lab04_kinds[k].kind, rank));
    return o;
}

static void lab04_group_text(const mc_grid *g, mc_group_kind kind, int rank, char *out,
                             size_t cap) {
    int *m = lab_xcalloc((size_t)g->desc.world, sizeof(int));
    int n = lab04_grid_group(g, kind, rank, m);
    lab_format_ints(out, cap, m, n);
    free(m);
}

/* ---------------------------------------------------------------------------------------------
   A. The 64-GPU layout from the rank generator */

typedef struct lab04_exp_a {
    int ran;
    int ep, etp;                        /* the variant's expert sizes */
    mc_grid dense_only;                 /* TP4 PP4 CP2, EP 1 */
    mc_grid grid;                       /* ... with the variant's EP and ETP */
    int default_etp_status;             /* mc_grid_init with ETP left at its default (= TP) */
    mc_grid default_etp_grid;           /* valid when that status is MC_OK */
    char default_etp_message[512];
    int mismatches;                     /* generator vs reference, over all 64 ranks */
    int probe;
    mc_rank_coords probe_coords;
} lab04_exp_a;

/* The probe's stage: its groups of `kind` that lie in that stage, drawn as one row; a colour
   per group (by its place in the stage), grey for a rank that is a group of its own. The
   expert row also names the expert each rank holds (eE.S: expert E, ETP shard S). */
static void lab04_figure_row(lab_svg *s, const mc_grid *g, mc_group_kind kind, int stage,
                             int probe, double y, const char *label) {
    int per_stage = g->desc.world / g->desc.pp, first_group = -1;
    int size = mc_grid_group_size(g, kind);
    lab_svg_text(s, 10, y - 8, LAB_SVG_START, 13, label);
    int *m = lab_xcalloc((size_t)g->desc.world, sizeof(int));
    for (int i = 0; i < per_stage; i++) {
        int r = stage * per_stage + i, gi = -1;
        MC_CHECK(mc_grid_group_of(g, kind, r, &gi, NULL));
        if (first_group < 0) first_group = gi;
        int n = lab04_grid_group(g, kind, r, m);
        char title[160], members[128], text[16];
        lab_format_ints(members, sizeof members, m, n);
        snprintf(title, sizeof title, "rank %d: %s group %s", r, mc_group_kind_name(kind),
                 members);
        double x = 10 + 44.0 * i;
        lab_svg_rect(s, x, y, 40, 34, size > 1 ? lab_svg_color(gi - first_group) : "#dddddd",
                     title);
        if (r == probe) {   /* the probe: a frame around its cell */
            lab_svg_line(s, x - 2, y - 2, x + 42, y - 2, "black", 3);
            lab_svg_line(s, x - 2, y + 36, x + 42, y + 36, "black", 3);
            lab_svg_line(s, x - 2, y - 2, x - 2, y + 36, "black", 3);
            lab_svg_line(s, x + 42, y - 2, x + 42, y + 36, "black", 3);
        }
        snprintf(text, sizeof text, "%d", r);
        lab_svg_text(s, x + 20, y + 16, LAB_SVG_MIDDLE, 13, text);
        if (kind == MC_GROUP_EXPERT_DP) {
            mc_rank_coords c;
            MC_CHECK(mc_grid_coords(g, r, &c));
            snprintf(text, sizeof text, "e%d.%d", c.ep, c.etp);
            lab_svg_text(s, x + 20, y + 30, LAB_SVG_MIDDLE, 10, text);
        }
    }
    free(m);
}

static void lab04_figure(lab_ctx *cx, const lab04_exp_a *a) {
    if (cx->me != 0) return;
    const mc_grid *g = &a->grid;
    int per_stage = g->desc.world / g->desc.pp, stage = a->probe_coords.pp;
    lab_svg *s = lab_svg_new(20 + 44.0 * per_stage, 230);
    char title[200], row1[160], row2[160];
    snprintf(title, sizeof title, "64 GPUs, TP=4 PP=4 CP=2 (DP=%d), EP=%d ETP=%d (EDP=%d): "
             "stage %d, probe rank %d framed", g->dp, a->ep, a->etp, g->edp, stage, a->probe);
    lab_svg_text(s, 10, 20, LAB_SVG_START, 13, title);
    int nd = mc_grid_group_size(g, MC_GROUP_DP_CP), ne = mc_grid_group_size(g, MC_GROUP_EXPERT_DP);
    snprintf(row1, sizeof row1, "dense DP x CP groups (%d rank%s each): one colour = dense "
             "gradients averaged together", nd, nd == 1 ? "" : "s");
    snprintf(row2, sizeof row2, "expert-DP groups (%d rank%s each): one colour = the replicas of "
             "one expert shard eE.S, averaged together", ne, ne == 1 ? "" : "s");
    lab04_figure_row(s, g, MC_GROUP_DP_CP, stage, a->probe, 60, row1);
    lab04_figure_row(s, g, MC_GROUP_EXPERT_DP, stage, a->probe, 150, row2);
    MC_CHECK(lab_figure(cx, "groups", s));
    lab_svg_free(s);
}

static void lab04_print_big(lab_ctx *cx, const lab04_exp_a *a) {
    const mc_grid *g = &a->grid;
    const mc_rank_coords *c = &a->probe_coords;
    char t[512];
    lab_printf0("dense:  DP = world / (TP*PP*CP) = 64 / (4*4*2) = %d  (with EP = 1: DP = %d)\n",
                g->dp, a->dense_only.dp);
    lab_printf0("EP=%d with ETP left at its default (= TP = 4): %s\n", a->ep,
                a->default_etp_status == MC_OK ? "accepted" : "refused");
    if (a->default_etp_status == MC_OK)
        lab_printf0("  EDP = 64 / (4*%d*4) = %d\n", a->ep, a->default_etp_grid.edp);
    else
        lab_printf0("  %s: %s\n", mc_err_name(a->default_etp_status), a->default_etp_message);
    lab_printf0("expert: EDP = world / (ETP*EP*PP) = 64 / (%d*%d*4) = %d   (ETP=%d)\n", a->etp,
                a->ep, g->edp, a->etp);
    lab_printf0("products: TP*CP*DP*PP = %d, ETP*EP*EDP*PP = %d, TP*PP*DP*EP = %d (%s 64)\n",
                g->desc.tp * g->desc.cp * g->dp * g->desc.pp,
                g->desc.etp * g->desc.ep * g->edp * g->desc.pp,
                g->desc.tp * g->desc.pp * g->dp * g->desc.ep,
                g->desc.tp * g->desc.pp * g->dp * g->desc.ep == 64 ? "==" : "!=");
    lab_printf0("probe rank %d: dense (tp %d, cp %d, dp %d, pp %d), "
                "expert (etp %d, ep %d, edp %d)\n",
                a->probe, c->tp, c->cp, c->dp, c->pp, c->etp, c->ep, c->edp);
    static const mc_group_kind shown[] = {MC_GROUP_TP, MC_GROUP_CP, MC_GROUP_DP, MC_GROUP_DP_CP,
                                          MC_GROUP_PP, MC_GROUP_EP, MC_GROUP_EXPERT_TP,
                                          MC_GROUP_EXPERT_DP};
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) {
        lab04_group_text(g, shown[i], a->probe, t, sizeof t);
        lab_printf0("  %-10s %s\n", mc_group_kind_name(shown[i]), t);
    }
    int per_stage = 64 / g->desc.pp, stage = c->pp;
    for (int pass = 0; pass < 2; pass++) {
        mc_group_kind kind = pass == 0 ? MC_GROUP_DP_CP : MC_GROUP_EXPERT_DP;
        lab_printf0("stage %d (ranks %d-%d), %s groups:", stage, stage * per_stage,
                    stage * per_stage + per_stage - 1, pass == 0 ? "dense DP x CP" : "expert-DP");
        int *m = lab_xcalloc(64, sizeof(int));
        for (int r = stage * per_stage; r < (stage + 1) * per_stage; r++) {
            int n = lab04_grid_group(g, kind, r, m);
            if (m[0] != r) continue;   /* print each group once, at its first member */
            lab_format_ints(t, sizeof t, m, n);
            lab_printf0(" %s", t);
        }
        free(m);
        lab_printf0("\n");
    }
}

static int lab04_experiment_a(lab_ctx *cx, lab04_exp_a *a) {
    lab_heading(cx, "A. 64 GPUs, TP=4 PP=4 CP=2, then EP: the rank generator, no communication");
    a->ep = lab04_variants[cx->variant - 1].ep;
    a->etp = lab04_variants[cx->variant - 1].etp;
    a->probe = cx->followup_probe;
    MC_CHECK(mc_grid_init(&a->dense_only, &lab04_big));

    mc_grid_desc d = lab04_big;
    d.ep = a->ep;   /* etp = 0: Megatron's default, ETP = TP */
    a->default_etp_status = mc_grid_init(&a->default_etp_grid, &d);
    snprintf(a->default_etp_message, sizeof a->default_etp_message, "%s",
             a->default_etp_status == MC_OK ? "" : mc_last_error());
    d.etp = a->etp;
    MC_CHECK(mc_grid_init(&a->grid, &d));
    const mc_grid *g = &a->grid;
    MC_CHECK(mc_grid_coords(g, a->probe, &a->probe_coords));

    lab04_coords *all = lab04_decode_all(g);
    a->mismatches = lab04_compare_grid(g, all);
    free(all);
    a->ran = 1;
    lab04_print_big(cx, a);
    lab04_figure(cx, a);

    int default_fits = 64 % (4 * a->ep * 4) == 0;
    lab_check(cx, g->dp == 64 / (4 * 4 * 2), "DP = 64 / (TP*PP*CP) = 2 (got %d)", g->dp);
    lab_check(cx, a->dense_only.dp == g->dp, "adding EP=%d leaves DP at %d (got %d)", a->ep,
              a->dense_only.dp, g->dp);
    lab_check(cx, g->edp == 64 / (a->etp * a->ep * 4), "EDP = 64 / (ETP*EP*PP) = %d (got %d)",
              64 / (a->etp * a->ep * 4), g->edp);
    lab_check(cx, (a->default_etp_status == MC_OK) == default_fits,
              "ETP left at TP=4 is %s: 4*%d*4 = %d %s 64", default_fits ? "accepted" : "refused",
              a->ep, 4 * a->ep * 4, default_fits ? "divides" : "does not divide");
    lab_check(cx, a->mismatches == 0,
              "all 64 ranks: coordinates and %d group kinds agree with the decoded order and "
              "the groups defined by shared coordinates (%d mismatches)",
              LAB04_N_KINDS, a->mismatches);
    return LAB_RAN;
}

static cJSON *lab04_a_json(const lab04_exp_a *a) {
    if (!a->ran) return cJSON_CreateNull();
    const mc_grid *g = &a->grid;
    int tp = g->desc.tp, pp = g->desc.pp, cp = g->desc.cp, ep = g->desc.ep, etp = g->desc.etp;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "world", g->desc.world);
    cJSON_AddNumberToObject(f, "tp", tp);
    cJSON_AddNumberToObject(f, "pp", pp);
    cJSON_AddNumberToObject(f, "cp", cp);
    cJSON_AddNumberToObject(f, "ep", ep);
    cJSON_AddNumberToObject(f, "etp", etp);
    cJSON_AddStringToObject(f, "order", g->order);
    cJSON_AddNumberToObject(f, "dp_size", g->dp);
    cJSON_AddNumberToObject(f, "dp_size_without_ep", a->dense_only.dp);
    cJSON_AddNumberToObject(f, "edp_size", g->edp);
    cJSON_AddNumberToObject(f, "tp_cp_dp_pp", tp * cp * g->dp * pp);
    cJSON_AddNumberToObject(f, "etp_ep_edp_pp", etp * ep * g->edp * pp);
    cJSON_AddNumberToObject(f, "tp_pp_dp_ep", tp * pp * g->dp * ep);
    cJSON_AddBoolToObject(f, "tp_pp_dp_ep_equals_world", tp * pp * g->dp * ep == g->desc.world);
    /* the world EP would need if it were one more orthogonal factor */
    cJSON_AddNumberToObject(f, "world_if_ep_multiplied", tp * pp * cp * g->dp * ep);
    cJSON *def = cJSON_AddObjectToObject(f, "etp_default");
    cJSON_AddNumberToObject(def, "etp", tp);
    cJSON_AddBoolToObject(def, "accepted", a->default_etp_status == MC_OK);
    cJSON_AddNumberToObject(def, "etp_ep_pp", tp * ep * pp);
    if (a->default_etp_status == MC_OK) {
        cJSON_AddNumberToObject(def, "edp_size", a->default_etp_grid.edp);
        cJSON_AddNullToObject(def, "message");
    } else {
        cJSON_AddNullToObject(def, "edp_size");
        cJSON_AddStringToObject(def, "message", a->default_etp_message);
    }
    cJSON_AddBoolToObject(f, "etp_default_accepted", a->default_etp_status == MC_OK);
    cJSON *probe = lab04_coords_json(&a->probe_coords);
    cJSON_AddItemToObject(probe, "groups", lab04_groups_of_json(g, a->probe));
    cJSON_AddItemToObject(probe, "dp_cp_group",
                          lab_json_grid_group_of(g, MC_GROUP_DP_CP, a->probe));
    cJSON_AddItemToObject(probe, "expert_dp_group",
                          lab_json_grid_group_of(g, MC_GROUP_EXPERT_DP, a->probe));
    cJSON_AddItemToObject(f, "probe", probe);
    /* the drawing: the groups of the probe's stage */
    cJSON *stage = cJSON_AddObjectToObject(f, "probe_stage");
    int per_stage = g->desc.world / pp, s = a->probe_coords.pp;
    cJSON_AddNumberToObject(stage, "pp_rank", s);
    cJSON_AddNumberToObject(stage, "first_rank", s * per_stage);
    cJSON_AddNumberToObject(stage, "last_rank", s * per_stage + per_stage - 1);
    int *m = lab_xcalloc((size_t)g->desc.world, sizeof(int));
    for (int pass = 0; pass < 2; pass++) {
        mc_group_kind kind = pass == 0 ? MC_GROUP_DP_CP : MC_GROUP_EXPERT_DP;
        cJSON *arr = cJSON_AddArrayToObject(stage, pass == 0 ? "dp_cp_groups" : "expert_dp_groups");
        for (int r = s * per_stage; r < (s + 1) * per_stage; r++) {
            int n = lab04_grid_group(g, kind, r, m);
            if (m[0] == r) cJSON_AddItemToArray(arr, lab_json_int_array(m, n));
        }
    }
    free(m);
    cJSON *chk = cJSON_AddObjectToObject(f, "reference_check");
    cJSON_AddStringToObject(chk, "what", "every rank's dense and expert coordinates decoded from "
                            "the order string, and each group as the ranks sharing every other "
                            "coordinate, against the rank generator");
    cJSON_AddNumberToObject(chk, "ranks", g->desc.world);
    cJSON_AddNumberToObject(chk, "group_kinds", LAB04_N_KINDS);
    cJSON_AddNumberToObject(chk, "mismatches", a->mismatches);
    return f;
}

/* ---------------------------------------------------------------------------------------------
   B and C. Real reductions: who is averaged with whom */

/* One reduction, as every rank read it back: member[r*W + j] says that rank j's one-hot
   gradient reached rank r's reduced gradient, with weight weight[r*W + j]. */
typedef struct lab04_reduction {
    mc_group_kind kind;            /* the group it ran over */
    double scale;                  /* the factor each contribution was expected to carry */
    double *weight;                /* [W * W] */
    int matches_grid;              /* every rank's contributors == its group of `kind` */
    int weights_ok;                /* every contribution carries `scale`, once */
    int ranks_mixing_experts;      /* ranks whose sum holds more than one (expert, shard) */
} lab04_reduction;

typedef struct lab04_layout {
    int ran, status;               /* status of mc_grid_init (refused: nothing ran) */
    char message[512];
    mc_grid grid;
    int *expert, *shard;           /* [W] the expert each rank holds, and its ETP shard */
    lab04_reduction dense;         /* dense grads over DP x CP */
    lab04_reduction expert_dp;     /* expert grads over expert-DP */
    lab04_reduction cross;         /* expert grads over the dense DP x CP group (wrong domain) */
    int mixing_expected;           /* some DP x CP group holds two different experts (reference) */
    double seconds;
} lab04_layout;

/* One parameter of W elements in its own table; the gradient is this rank's one-hot vector,
   reduced by the library's DDP layer over `group` with `factor` (0 = 1/size). The gradient
   lives in the world's memory (host for the CPU table, the GPU for a CUDA one), as a model's
   would. Writes the reduced vector into out[W]. */
static void lab04_reduce_ddp(lab_ctx *cx, mc_comm *group, const char *name, float factor,
                             double *out) {
    int W = cx->world_size;
    mc_param_table t;
    memset(&t, 0, sizeof t);
    mc_param_info p;
    memset(&p, 0, sizeof p);
    p.ndim = 1;
    p.global_shape[0] = p.local_shape[0] = W;
    p.partition_dim = -1;
    MC_CHECK(mc_param_table_add(&t, name, &p));
    MC_CHECK(mc_param_table_layout(&t, &(mc_param_layout_desc){.dp_size = group->size}));
    float *grads = mc_comm_alloc(group, t.total * sizeof(float));   /* [t.total], op memory */
    if (grads == NULL) MC_CHECK(MC_ERR_NO_MEMORY);
    mc_ddp ddp;
    MC_CHECK(mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &t, .grads = grads, .dp = group,
                                              .gradient_scaling_factor = factor,
                                              .ops = mc_comm_memory(group)}));
    MC_CHECK(mc_ddp_zero_grad(&ddp));
    float *host = lab_xcalloc((size_t)W, sizeof(float));            /* [W] */
    float *g = grads + t.info[0].offset;                            /* [W], op memory */
    host[cx->me] = 1.0f;
    MC_CHECK(mc_comm_upload(group, g, host, (size_t)W * sizeof(float)));
    MC_CHECK(mc_ddp_set_grad_sync(&ddp, -1, 1));
    MC_CHECK(mc_ddp_finish_grad_sync(&ddp));
    MC_CHECK(mc_comm_download(group, host, g, (size_t)W * sizeof(float)));
    for (int j = 0; j < W; j++) out[j] = host[j];
    MC_CHECK(mc_ddp_destroy(&ddp));
    mc_param_table_free(&t);
    mc_comm_free(group, grads);
    free(host);
}

/* Runs one reduction on this rank and gathers every rank's result into red->weight. */
static void lab04_reduce(lab_ctx *cx, const mc_parallel_state *ps, lab04_reduction *red,
                         mc_group_kind kind, const char *name, double scale) {
    int W = cx->world_size;
    mc_comm *group = mc_parallel_group(ps, kind);
    double *mine = lab_xcalloc((size_t)W, sizeof(double));
    float factor = (float)scale;
    lab04_reduce_ddp(cx, group, name, factor, mine);
    red->kind = kind;
    red->scale = scale;
    red->weight = lab_xcalloc((size_t)W * (size_t)W, sizeof(double));
    MC_CHECK(lab_all_gather_f64(cx->world, mine, red->weight, (size_t)W));
    free(mine);
}

static int lab04_contributors(const lab04_reduction *red, int W, int rank, int *out) {
    int n = 0;
    for (int j = 0; j < W; j++)
        if (red->weight[(size_t)rank * W + j] != 0.0) out[n++] = j;
    return n;
}

/* Compares what the reduction did with the grid's groups, the expected weight, and the
   experts held by the contributors. */
static void lab04_judge(const lab04_layout *L, lab04_reduction *red, int W) {
    int *got = lab_xcalloc((size_t)W, sizeof(int)), *want = lab_xcalloc((size_t)W, sizeof(int));
    red->matches_grid = red->weights_ok = 1;
    red->ranks_mixing_experts = 0;
    for (int r = 0; r < W; r++) {
        int n = lab04_contributors(red, W, r, got);
        int m = lab04_grid_group(&L->grid, red->kind, r, want);
        if (!lab_ints_same_set(got, n, want, m)) red->matches_grid = 0;
        int mixed = 0;
        for (int i = 0; i < n; i++) {
            double w = red->weight[(size_t)r * W + got[i]];
            if (fabs(w - red->scale) > 1e-6 * red->scale) red->weights_ok = 0;
            if (L->expert[got[i]] != L->expert[got[0]] || L->shard[got[i]] != L->shard[got[0]])
                mixed = 1;
        }
        red->ranks_mixing_experts += mixed;
    }
    free(got);
    free(want);
}

/* Reference for the cross reduction: does any DP x CP group (shared tp and pp coordinates)
   hold two ranks with different expert coordinates (ep, etp)? */
static int lab04_mixing_by_definition(const mc_grid *g) {
    int W = g->desc.world, mixed = 0;
    lab04_coords *all = lab04_decode_all(g);
    for (int r = 0; r < W && !mixed; r++)
        for (int s = 0; s < W && !mixed; s++)
            if (all[r].dense[AX_TP] == all[s].dense[AX_TP] &&
                all[r].dense[AX_PP] == all[s].dense[AX_PP] &&
                (all[r].expert[AX_EP] != all[s].expert[AX_EP] ||
                 all[r].expert[AX_TP] != all[s].expert[AX_TP]))
                mixed = 1;
    free(all);
    return mixed;
}

static void lab04_run_layout(lab_ctx *cx, const mc_grid_desc *desc, lab04_layout *L) {
    int W = cx->world_size;
    double t0 = lab_now();
    L->status = mc_grid_init(&L->grid, desc);
    if (L->status != MC_OK) {
        snprintf(L->message, sizeof L->message, "%s", mc_last_error());
        return;
    }
    mc_parallel_state ps;
    MC_CHECK(mc_parallel_init(&ps, &(mc_parallel_desc){.world = cx->world, .grid = *desc}));
    /* which expert (one local expert per EP rank) and which ETP shard of it each rank holds */
    int mine[2] = {ps.coords.ep, ps.coords.etp}, *both = lab_xcalloc((size_t)W * 2, sizeof(int));
    MC_CHECK(lab_all_gather_i32(cx->world, mine, both, 2));
    L->expert = lab_xcalloc((size_t)W, sizeof(int));
    L->shard = lab_xcalloc((size_t)W, sizeof(int));
    for (int r = 0; r < W; r++) {
        L->expert[r] = both[2 * r];
        L->shard[r] = both[2 * r + 1];
    }
    free(both);
    /* Megatron's factor for both buffers: 1 / (DP x CP), the dense data-parallel size */
    double scale = 1.0 / (L->grid.dp * L->grid.desc.cp);
    char expert_name[MC_PARAM_NAME_MAX];
    snprintf(expert_name, sizeof expert_name,
             "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight");
    lab04_reduce(cx, &ps, &L->dense, MC_GROUP_DP_CP, "decoder.layers.0.input_layernorm.weight",
                 scale);
    lab04_reduce(cx, &ps, &L->expert_dp, MC_GROUP_EXPERT_DP, expert_name, scale);
    lab04_reduce(cx, &ps, &L->cross, MC_GROUP_DP_CP, expert_name, scale);
    MC_CHECK(mc_parallel_destroy(&ps));
    lab04_judge(L, &L->dense, W);
    lab04_judge(L, &L->expert_dp, W);
    lab04_judge(L, &L->cross, W);
    L->mixing_expected = lab04_mixing_by_definition(&L->grid);
    L->ran = 1;
    double dt = lab_now() - t0, slowest = 0;
    MC_CHECK(lab_all_reduce_f64(cx->world, &dt, &slowest, 1, MC_MAX));
    L->seconds = slowest;
}

static void lab04_contrib_text(const lab04_reduction *red, int W, int rank, char *out, size_t cap) {
    int *m = lab_xcalloc((size_t)W, sizeof(int));
    int n = lab04_contributors(red, W, rank, m);
    lab_format_ints(out, cap, m, n);
    free(m);
}

static void lab04_print_layout(const lab_ctx *cx, const lab04_layout *L) {
    const mc_grid *g = &L->grid;
    int W = cx->world_size;
    const mc_grid_desc *d = &g->desc;
    lab_printf0("world %d: dense TP=%d CP=%d PP=%d -> DP = %d / (%d*%d*%d) = %d; expert ETP=%d "
                "EP=%d PP=%d -> EDP = %d / (%d*%d*%d) = %d\n", W, d->tp, d->cp, d->pp, W, d->tp,
                d->pp, d->cp, g->dp, d->etp, d->ep, d->pp, W, d->etp, d->ep, d->pp, g->edp);
    lab_printf0("reduced with %s; each contribution expected at 1/(DP*CP) = %g\n", LAB04_REDUCTION_PATH,
                L->dense.scale);
    lab_printf0("rank | tp cp dp pp | etp ep edp | expert | dense grad from | expert grad from "
                "| expert grad over DP x CP from\n");
    for (int r = 0; r < W; r++) {
        if (W > LAB04_PRINT_ALL_RANKS && r != cx->probe) continue;
        mc_rank_coords c;
        MC_CHECK(mc_grid_coords(g, r, &c));
        char a[160], b[160], x[160];
        lab04_contrib_text(&L->dense, W, r, a, sizeof a);
        lab04_contrib_text(&L->expert_dp, W, r, b, sizeof b);
        lab04_contrib_text(&L->cross, W, r, x, sizeof x);
        lab_printf0("%4d%s|  %d  %d  %d  %d |  %d   %d  %d  | e%d.%d  | %-15s | %-16s | %s\n", r,
                    r == cx->probe ? "*" : " ", c.tp, c.cp, c.dp, c.pp, c.etp, c.ep, c.edp,
                    L->expert[r], L->shard[r], a, b, x);
    }
    lab_printf0("(* the probe rank; eE.S = expert E, ETP shard S)\n");
}

static void lab04_check_layout(lab_ctx *cx, const lab04_layout *L, const char *tag) {
    int W = cx->world_size;
    lab_check(cx, L->dense.matches_grid && L->dense.weights_ok,
              "%s: every rank's dense gradient holds exactly its DP x CP group, each at %g", tag,
              L->dense.scale);
    lab_check(cx, L->expert_dp.matches_grid && L->expert_dp.weights_ok,
              "%s: every rank's expert gradient holds exactly its expert-DP group, each at %g", tag,
              L->expert_dp.scale);
    lab_check(cx, L->expert_dp.ranks_mixing_experts == 0,
              "%s: no expert-DP reduction averages two different experts (%d of %d ranks do)", tag,
              L->expert_dp.ranks_mixing_experts, W);
    lab_check(cx, L->cross.matches_grid, "%s: the expert grads reduced over DP x CP hold the "
              "DP x CP groups", tag);
    lab_check(cx, (L->cross.ranks_mixing_experts > 0) == L->mixing_expected,
              "%s: reducing expert grads over DP x CP %s different experts (%d of %d ranks), as "
              "the coordinates say", tag, L->mixing_expected ? "mixes" : "does not mix",
              L->cross.ranks_mixing_experts, W);
}

static int lab04_experiment_b(lab_ctx *cx, lab04_layout *L) {
    lab_heading(cx, "B. A real run on %d ranks: who is averaged with whom", cx->world_size);
    lab04_run_layout(cx, &cx->grid.desc, L);
    lab04_print_layout(cx, L);
    const mc_grid *g = &L->grid;
    int W = cx->world_size, tp = g->desc.tp, pp = g->desc.pp, ep = g->desc.ep;
    int naive = tp * pp * g->dp * ep;
    lab_printf0("TP*PP*DP*EP = %d*%d*%d*%d = %d%s\n", tp, pp, g->dp, ep, naive,
                naive == W ? (ep == g->desc.cp ? " = world here only because EP = CP" : " = world")
                           : " != world");
    lab_check(cx, g->dp == W / (tp * pp * g->desc.cp), "DP = world / (TP*PP*CP) = %d",
              W / (tp * pp * g->desc.cp));
    lab_check(cx, g->edp == W / (g->desc.etp * ep * pp), "EDP = world / (ETP*EP*PP) = %d",
              W / (g->desc.etp * ep * pp));
    lab04_check_layout(cx, L, "B");
    return LAB_RAN;
}

/* C: the other ETP: TP when the run has ETP = 1, else 1. */
static int lab04_contrast_etp(const lab_ctx *cx) {
    return cx->grid.desc.etp == 1 ? cx->grid.desc.tp : 1;
}

static int lab04_experiment_c(lab_ctx *cx, lab04_layout *L) {
    int etp = lab04_contrast_etp(cx);
    lab_heading(cx, "C. The same world with ETP = %d instead of %d", etp, cx->grid.desc.etp);
    if (etp == cx->grid.desc.etp) {
        lab_printf0("TP = 1: there is no other ETP to compare with; skipped\n");
        return LAB_SKIPPED;
    }
    mc_grid_desc d = cx->grid.desc;
    d.etp = etp;
    lab04_run_layout(cx, &d, L);
    if (L->status != MC_OK) {
        /* Megatron's two rules that can refuse a change of ETP alone: ETP x EP x PP must
           divide the world, and an order that does not end with pp needs EDP == DP */
        int W = cx->world_size, divides = W % (etp * d.ep * d.pp) == 0;
        size_t n = strlen(cx->grid.order);
        int pp_last = n >= 2 && strcmp(cx->grid.order + n - 2, "pp") == 0;
        int same_dp = divides && W / (etp * d.ep * d.pp) == cx->grid.dp;
        lab_printf0("ETP=%d is refused on this world: %s\n", etp, L->message);
        lab_check(cx, !divides || (!pp_last && d.pp > 1 && !same_dp),
                  "refused by a rule of Megatron's: ETP*EP*PP = %d %s %d%s", etp * d.ep * d.pp,
                  divides ? "divides" : "does not divide", W,
                  divides ? ", and the order does not end with pp while EDP != DP" : "");
        return LAB_RAN;
    }
    lab04_print_layout(cx, L);
    lab_check(cx, L->grid.dp == cx->grid.dp, "DP stays %d when only ETP changes", cx->grid.dp);
    lab_check(cx, L->grid.edp == cx->world_size / (etp * d.ep * d.pp),
              "EDP = world / (ETP*EP*PP) = %d", cx->world_size / (etp * d.ep * d.pp));
    lab04_check_layout(cx, L, "C");
    return LAB_RAN;
}

static cJSON *lab04_contributors_json(const lab04_reduction *red, int W, int rank) {
    int *m = lab_xcalloc((size_t)W, sizeof(int));
    int n = lab04_contributors(red, W, rank, m);
    cJSON *a = lab_json_int_array(m, n);
    free(m);
    return a;
}

/* The distinct contributor sets over all ranks: the groups as the reduction measured them. */
static cJSON *lab04_measured_groups_json(const lab04_reduction *red, int W) {
    cJSON *arr = cJSON_CreateArray();
    int *m = lab_xcalloc((size_t)W, sizeof(int));
    for (int r = 0; r < W; r++) {
        int n = lab04_contributors(red, W, r, m);
        if (n > 0 && m[0] == r) cJSON_AddItemToArray(arr, lab_json_int_array(m, n));
    }
    free(m);
    return arr;
}

static cJSON *lab04_reduction_json(const lab04_layout *L, const lab04_reduction *red, int W,
                                   int probe) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "group_kind", mc_group_kind_name(red->kind));
    cJSON_AddNumberToObject(o, "scale", red->scale);
    cJSON_AddItemToObject(o, "measured_groups", lab04_measured_groups_json(red, W));
    cJSON_AddItemToObject(o, "grid_groups", lab_json_grid_groups(&L->grid, red->kind));
    cJSON_AddBoolToObject(o, "matches_grid", red->matches_grid);
    cJSON_AddBoolToObject(o, "weights_ok", red->weights_ok);
    cJSON_AddNumberToObject(o, "ranks_mixing_experts", red->ranks_mixing_experts);
    cJSON_AddItemToObject(o, "probe_contributors", lab04_contributors_json(red, W, probe));
    int *m = lab_xcalloc((size_t)W, sizeof(int));
    int n = lab04_contributors(red, W, probe, m);
    cJSON *held = cJSON_AddArrayToObject(o, "probe_contributor_experts");
    for (int i = 0; i < n; i++) {
        char e[24];
        snprintf(e, sizeof e, "e%d.%d", L->expert[m[i]], L->shard[m[i]]);
        cJSON_AddItemToArray(held, cJSON_CreateString(e));
    }
    free(m);
    return o;
}

static cJSON *lab04_layout_json(const lab_ctx *cx, const lab04_layout *L) {
    cJSON *o = cJSON_CreateObject();
    int W = cx->world_size, probe = cx->probe;
    const mc_grid *g = &L->grid;
    cJSON_AddBoolToObject(o, "ran", L->ran);
    if (!L->ran && L->status == MC_OK) return o;   /* skipped */
    if (L->status != MC_OK) {
        cJSON_AddBoolToObject(o, "accepted", 0);
        cJSON_AddStringToObject(o, "message", L->message);
        return o;
    }
    cJSON_AddBoolToObject(o, "accepted", 1);
    const mc_grid_desc *d = &g->desc;
    cJSON_AddNumberToObject(o, "world", W);
    cJSON_AddNumberToObject(o, "tp", d->tp);
    cJSON_AddNumberToObject(o, "cp", d->cp);
    cJSON_AddNumberToObject(o, "pp", d->pp);
    cJSON_AddNumberToObject(o, "ep", d->ep);
    cJSON_AddNumberToObject(o, "etp", d->etp);
    cJSON_AddNumberToObject(o, "dp_size", g->dp);
    cJSON_AddNumberToObject(o, "edp_size", g->edp);
    cJSON_AddNumberToObject(o, "tp_pp_dp_ep", d->tp * d->pp * g->dp * d->ep);
    cJSON_AddBoolToObject(o, "tp_pp_dp_ep_equals_world", d->tp * d->pp * g->dp * d->ep == W);
    cJSON_AddStringToObject(o, "reduction_path", LAB04_REDUCTION_PATH);
    cJSON_AddNumberToObject(o, "seconds", lab_round_s(L->seconds));
    mc_rank_coords c;
    MC_CHECK(mc_grid_coords(g, probe, &c));
    cJSON *p = lab04_coords_json(&c);
    cJSON_AddNumberToObject(p, "expert", L->expert[probe]);
    cJSON_AddNumberToObject(p, "expert_shard", L->shard[probe]);
    cJSON_AddItemToObject(p, "groups", lab04_groups_of_json(g, probe));
    cJSON_AddItemToObject(p, "dp_cp_group", lab_json_grid_group_of(g, MC_GROUP_DP_CP, probe));
    cJSON_AddItemToObject(p, "expert_dp_group",
                          lab_json_grid_group_of(g, MC_GROUP_EXPERT_DP, probe));
    cJSON_AddItemToObject(p, "dense_contributors", lab04_contributors_json(&L->dense, W, probe));
    cJSON_AddItemToObject(p, "expert_contributors",
                          lab04_contributors_json(&L->expert_dp, W, probe));
    cJSON_AddItemToObject(p, "cross_contributors", lab04_contributors_json(&L->cross, W, probe));
    cJSON_AddItemToObject(o, "probe", p);
    cJSON_AddItemToObject(o, "expert_of_rank", lab_json_int_array(L->expert, W));
    cJSON_AddItemToObject(o, "expert_shard_of_rank", lab_json_int_array(L->shard, W));
    cJSON_AddItemToObject(o, "dense", lab04_reduction_json(L, &L->dense, W, probe));
    cJSON_AddItemToObject(o, "expert", lab04_reduction_json(L, &L->expert_dp, W, probe));
    cJSON_AddItemToObject(o, "cross", lab04_reduction_json(L, &L->cross, W, probe));
    cJSON_AddBoolToObject(o, "cross_mixes_experts", L->cross.ranks_mixing_experts > 0);
    int same = 1;
    int *a = lab_xcalloc((size_t)W, sizeof(int)), *b = lab_xcalloc((size_t)W, sizeof(int));
    for (int r = 0; r < W; r++) {
        int na = lab04_contributors(&L->dense, W, r, a);
        int nb = lab04_contributors(&L->expert_dp, W, r, b);
        same &= lab_ints_same_set(a, na, b, nb);
    }
    free(a);
    free(b);
    cJSON_AddBoolToObject(o, "expert_groups_same_members_as_dense", same);
    return o;
}

static void lab04_layout_free(lab04_layout *L) {
    free(L->expert);
    free(L->shard);
    free(L->dense.weight);
    free(L->expert_dp.weight);
    free(L->cross.weight);
}

/* ---------------------------------------------------------------------------------------------
   The lab */

typedef struct lab04_state {
    lab04_exp_a a;
    lab04_layout b, c;
} lab04_state;

#define LAB04_ST(cx) ((lab04_state *)(cx)->state)
static int lab04_run_a(lab_ctx *cx) { return lab04_experiment_a(cx, &LAB04_ST(cx)->a); }
static int lab04_run_b(lab_ctx *cx) { return lab04_experiment_b(cx, &LAB04_ST(cx)->b); }
static int lab04_run_c(lab_ctx *cx) { return lab04_experiment_c(cx, &LAB04_ST(cx)->c); }

static cJSON *lab04_facts(lab_ctx *cx) {
    const lab04_state *st = cx->state;
    const mc_grid *g = &cx->grid;
    const mc_grid_desc *d = &g->desc;
    int W = cx->world_size;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "world", W);
    cJSON_AddNumberToObject(f, "dp_size", g->dp);
    cJSON_AddNumberToObject(f, "edp_size", g->edp);
    char text[160];
    snprintf(text, sizeof text, "DP = %d / (%d*%d*%d) = %d", W, d->tp, d->pp, d->cp, g->dp);
    cJSON_AddStringToObject(f, "dp_formula", text);
    snprintf(text, sizeof text, "EDP = %d / (%d*%d*%d) = %d", W, d->etp, d->ep, d->pp, g->edp);
    cJSON_AddStringToObject(f, "edp_formula", text);
    cJSON_AddNumberToObject(f, "tp_cp_dp_pp", d->tp * d->cp * g->dp * d->pp);
    cJSON_AddNumberToObject(f, "etp_ep_edp_pp", d->etp * d->ep * g->edp * d->pp);
    cJSON_AddNumberToObject(f, "tp_pp_dp_ep", d->tp * d->pp * g->dp * d->ep);
    cJSON_AddBoolToObject(f, "tp_pp_dp_ep_equals_world", d->tp * d->pp * g->dp * d->ep == W);
    /* the run's probe, flat where the predictions point */
    const lab04_layout *b = &st->b;
    if (b->ran) {
        mc_rank_coords c;
        MC_CHECK(mc_grid_coords(g, cx->probe, &c));
        cJSON *p = lab04_coords_json(&c);
        cJSON_AddItemToObject(p, "dp_cp_group",
                              lab_json_grid_group_of(g, MC_GROUP_DP_CP, cx->probe));
        cJSON_AddItemToObject(p, "expert_dp_group",
                              lab_json_grid_group_of(g, MC_GROUP_EXPERT_DP, cx->probe));
        cJSON_AddItemToObject(p, "dense_contributors",
                              lab04_contributors_json(&b->dense, W, cx->probe));
        cJSON_AddItemToObject(p, "expert_contributors",
                              lab04_contributors_json(&b->expert_dp, W, cx->probe));
        cJSON_AddItemToObject(f, "probe", p);
    } else {
        cJSON_AddNullToObject(f, "probe");
    }
    cJSON_AddItemToObject(f, "run", lab04_layout_json(cx, b));
    cJSON *c = lab04_layout_json(cx, &st->c);
    if (!cJSON_HasObjectItem(c, "etp")) cJSON_AddNumberToObject(c, "etp", lab04_contrast_etp(cx));
    cJSON_AddItemToObject(f, "etp_contrast", c);
    cJSON_AddItemToObject(f, "followup", lab04_a_json(&st->a));
    return f;
}

static void lab04_report(lab_ctx *cx) {
    const lab04_state *st = cx->state;
    int W = cx->world_size;
    char d[160], e[160];
    lab_printf0("\n== Measured ==\n");
    lab_printf0("run: DP %d, EDP %d; probe rank %d\n", cx->grid.dp, cx->grid.edp, cx->probe);
    if (st->b.ran) {
        lab04_contrib_text(&st->b.dense, W, cx->probe, d, sizeof d);
        lab04_contrib_text(&st->b.expert_dp, W, cx->probe, e, sizeof e);
        lab_printf0("  dense gradient of rank %d came from %s (DP x CP); expert gradient from %s "
                    "(expert-DP)\n", cx->probe, d, e);
    }
    if (st->c.ran) {
        lab04_contrib_text(&st->c.expert_dp, W, cx->probe, e, sizeof e);
        lab04_contrib_text(&st->c.cross, W, cx->probe, d, sizeof d);
        lab_printf0("  ETP=%d: EDP %d, expert gradient from %s; over DP x CP it would come from "
                    "%s (%s experts)\n", st->c.grid.desc.etp, st->c.grid.edp, e, d,
                    st->c.cross.ranks_mixing_experts > 0 ? "mixing" : "not mixing");
    }
    if (st->a.ran)
        lab_printf0("follow-up F%d: 64 GPUs TP4 PP4 CP2 EP%d ETP%d: DP %d, EDP %d; ETP=TP %s; "
                    "probe rank %d\n", cx->variant, st->a.ep, st->a.etp, st->a.grid.dp,
                    st->a.grid.edp, st->a.default_etp_status == MC_OK ? "accepted" : "refused",
                    st->a.probe);
}

static void lab04_cleanup(lab_ctx *cx) {
    lab04_state *st = cx->state;
    lab04_layout_free(&st->b);
    lab04_layout_free(&st->c);
}

static const char lab04_summary[] =
    "lab04 (M004): derives the 64-GPU layout TP4 PP4 CP2 and its expert grid with the rank\n"
    "generator (no communication), then reduces one dense and one expert gradient per rank,\n"
    "each the one-hot vector of its rank id, through the DDP layer over DP x CP and over\n"
    "expert-DP, and reads back who was averaged with whom; again with the other ETP. Then\n"
    "grades answers/lab04.md. Defaults: TP=2, CP=2, EP=2, ETP=1 on 8 ranks (DP derived).";

static const lab_experiment lab04_experiments[] = {
    {"A", lab04_run_a},
    {"B", lab04_run_b},
    {"C", lab04_run_c},
};

static const lab_spec lab04_spec = {
    .name = "lab04",
    .question = "M004",
    .title = "deriving DP, TP, PP, CP; why EP does not multiply",
    .summary = lab04_summary,
    .default_world = 8,
    .sizes = {.tp = 2, .cp = 2, .ep = 2, .etp = 1},
    .max_world = LAB04_MAX_WORLD,
    .n_variants = LAB04_N_VARIANTS,
    .followup_world = LAB04_BIG_WORLD,
    .experiments = lab04_experiments,
    .n_experiments = (int)(sizeof lab04_experiments / sizeof lab04_experiments[0]),
    .state_size = sizeof(lab04_state),
    .facts = lab04_facts,
    .report = lab04_report,
    .cleanup = lab04_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &lab04_spec); }
