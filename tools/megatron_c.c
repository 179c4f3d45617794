/* megatron_c - a command-line calculator for Megatron-Core's parallel layout.

       make megatron_c
       ./megatron_c layout --world 16 --tp 2 --pp 4               coordinates and every group
       ./megatron_c layout --world 16 --tp 2 --pp 4 --rank 5      one rank: its groups, neighbours
       ./megatron_c layout --world 16 --tp 2 --pp 4 --json        the same as one JSON object
       ./megatron_c layout --world 16 --tp 2 --pp 4 --svg g.svg   a drawing of the rank grid
       ./megatron_c memory --num-layers 24 --hidden-size 1024 ...  bytes per rank and stage
                                                    (pretrain_gpt's flags; --json, --svg)
       ./megatron_c help [command]

   Everything is computed by the rank grid of megatron_c.h (Megatron's RankGenerator), which is a
   pure function of the sizes: no MPI, no GPU, any world size.

   Exit status: 0 success; 1 an output could not be written; 2 bad usage or an invalid
   combination of sizes (stderr then names the values and the rule Megatron enforces).

   Adding a subcommand: write `static int cmd_<name>(int argc, char **argv)` and
   `static void usage_<name>(FILE *out)`, then add one row to cli_commands[]. */
#define MEGATRON_C_IMPLEMENTATION
#include "megatron_c.h"
#include "examples/pretrain_gpt_args.h"   /* pretrain_gpt's flags, for `memory` */

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLI_NAME "megatron_c"

enum { CLI_EXIT_OK = 0, CLI_EXIT_FAILURE = 1, CLI_EXIT_USAGE = 2 };

/* ---------------------------------------------------------------------------------------------
   Option parsing shared by every subcommand: a table of long options, each writing into a field
   of the subcommand's own argument struct. "--name value" and "--name=value" are both accepted. */

typedef enum cli_option_type { CLI_OPT_INT, CLI_OPT_STRING, CLI_OPT_FLAG } cli_option_type;

typedef struct cli_option {
    const char *name;      /* without the leading dashes: "world" for --world */
    cli_option_type type;
    void *target;          /* int * for INT and FLAG, const char ** for STRING */
    int min_value;         /* INT only: the smallest value accepted */
    const char *metavar;   /* shown in the usage: "N", "FILE" */
    const char *help;
} cli_option;

typedef enum cli_parse_result { CLI_PARSED = 0, CLI_WANTS_HELP, CLI_BAD_USAGE } cli_parse_result;

static void cli_print_options(FILE *out, const cli_option *opts, int n_opts) {
    for (int i = 0; i < n_opts; ++i) {
        char left[64];
        if (opts[i].type == CLI_OPT_FLAG)
            snprintf(left, sizeof left, "--%s", opts[i].name);
        else
            snprintf(left, sizeof left, "--%s %s", opts[i].name, opts[i].metavar);
        if (strlen(left) > 20)   /* a long option gets its own line, the help goes below */
            fprintf(out, "  %s\n  %-20s %s\n", left, "", opts[i].help);
        else
            fprintf(out, "  %-20s %s\n", left, opts[i].help);
    }
    fprintf(out, "  %-20s %s\n", "--help", "show this help");
}

static const cli_option *cli_find_option(const cli_option *opts, int n_opts, const char *name,
                                         size_t name_len) {
    for (int i = 0; i < n_opts; ++i)
        if (strlen(opts[i].name) == name_len && strncmp(opts[i].name, name, name_len) == 0)
            return &opts[i];
    return NULL;
}

/* Parses a whole decimal int; rejects trailing text, overflow and values below `min_value`. */
static int cli_parse_int(const char *command, const cli_option *opt, const char *text) {
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (end == text || *end != '\0') {
        fprintf(stderr, "%s %s: --%s expects an integer, got '%s'\n", CLI_NAME, command,
                opt->name, text);
        return -1;
    }
    if (errno == ERANGE || value > INT_MAX || value < INT_MIN) {
        fprintf(stderr, "%s %s: --%s value %s is out of range (an int holds %d .. %d)\n",
                CLI_NAME, command, opt->name, text, INT_MIN, INT_MAX);
        return -1;
    }
    if (value < opt->min_value) {
        fprintf(stderr, "%s %s: --%s must be >= %d, got %ld\n", CLI_NAME, command, opt->name,
                opt->min_value, value);
        return -1;
    }
    *(int *)opt->target = (int)value;
    return 0;
}

/* Walks argv[1..argc) (argv[0] is the subcommand). Errors are printed; the caller prints the
   usage and returns CLI_EXIT_USAGE. */
static cli_parse_result cli_parse(const char *command, const cli_option *opts, int n_opts,
                                  int argc, char **argv) {
    unsigned char seen[64] = {0};   /* a subcommand has at most 16 options */
    for (int i = 1; i < argc; ++i) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return CLI_WANTS_HELP;
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "%s %s: unexpected argument '%s'\n", CLI_NAME, command, arg);
            return CLI_BAD_USAGE;
        }
        const char *name = arg + 2;
        const char *equals = strchr(name, '=');
        size_t name_len = equals ? (size_t)(equals - name) : strlen(name);
        const cli_option *opt = cli_find_option(opts, n_opts, name, name_len);
        if (!opt) {
            fprintf(stderr, "%s %s: unknown option '%.*s'\n", CLI_NAME, command,
                    (int)name_len + 2, arg);
            return CLI_BAD_USAGE;
        }
        /* A repeated option is an error: keeping the last value silently hides an edit. */
        if (seen[opt - opts]++) {
            fprintf(stderr, "%s %s: --%s is given more than once; give each option once\n",
                    CLI_NAME, command, opt->name);
            return CLI_BAD_USAGE;
        }
        if (opt->type == CLI_OPT_FLAG) {
            if (equals) {
                fprintf(stderr, "%s %s: --%s takes no value\n", CLI_NAME, command, opt->name);
                return CLI_BAD_USAGE;
            }
            *(int *)opt->target = 1;
            continue;
        }
        const char *value = equals ? equals + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value || (!equals && strncmp(value, "--", 2) == 0)) {
            fprintf(stderr, "%s %s: --%s needs a value (%s)\n", CLI_NAME, command, opt->name,
                    opt->metavar);
            return CLI_BAD_USAGE;
        }
        if (opt->type == CLI_OPT_STRING)
            *(const char **)opt->target = value;
        else if (cli_parse_int(command, opt, value) != 0)
            return CLI_BAD_USAGE;
    }
    return CLI_PARSED;
}

/* ---------------------------------------------------------------------------------------------
   Small output helpers. */

static void json_write_string(FILE *out, const char *s) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; ++p) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

static void xml_write_escaped(FILE *out, const char *s) {
    for (; *s; ++s) {
        switch (*s) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*s, out);
        }
    }
}

/* "[0,4,8,12]" into buf (cap >= 16); a list that does not fit ends in ",...]". */
static void format_rank_list(char *buf, size_t cap, const int *ranks, int n) {
    size_t used = 0;
    buf[used++] = '[';
    for (int i = 0; i < n; ++i) {
        char item[16];
        int len = snprintf(item, sizeof item, "%s%d", i ? "," : "", ranks[i]);
        if (used + (size_t)len + sizeof ",...]" > cap) {
            snprintf(buf + used, cap - used, "%s...]", i ? "," : "");
            return;
        }
        memcpy(buf + used, item, (size_t)len);
        used += (size_t)len;
    }
    memcpy(buf + used, "]", 2);
}

/* ---------------------------------------------------------------------------------------------
   layout: the rank grid and every group kind of Megatron's parallel_state. */

typedef struct layout_args {
    int world, tp, pp, cp, ep, etp, vpp;
    int rank;               /* -1: all ranks */
    int json;
    const char *order;
    const char *svg_path;
    const char *color_by;
} layout_args;

/* What each group is for in Megatron, shown next to a rank's groups (at most 34 chars). */
static const char *layout_group_purpose(mc_group_kind kind) {
    switch (kind) {
    case MC_GROUP_TP: return "TP collectives, SP norm grads";
    case MC_GROUP_PP: return "send/recv between stages";
    case MC_GROUP_DP: return "data sharding (excludes cp)";
    case MC_GROUP_DP_CP: return "dense grad all-reduce, loss mean";
    case MC_GROUP_CP: return "context-parallel attention";
    case MC_GROUP_MP: return "grad-norm reduction (tp x pp)";
    case MC_GROUP_TP_DP: return "fp8 amax, router token stats";
    case MC_GROUP_TP_DP_CP: return "fp8 amax with context parallel";
    case MC_GROUP_TP_CP: return "tensor x context parallel";
    case MC_GROUP_EMBEDDING: return "tied embedding grads (first+last)";
    case MC_GROUP_POSITION_EMBEDDING: return "position-embedding grads (first)";
    case MC_GROUP_EP: return "MoE token all-to-all";
    case MC_GROUP_EXPERT_TP: return "tensor parallel inside experts";
    case MC_GROUP_TP_EP: return "expert tp x ep";
    case MC_GROUP_TP_EP_PP: return "expert model parallel";
    case MC_GROUP_EXPERT_DP: return "expert grad all-reduce";
    default: return "";
    }
}

static int layout_options(layout_args *a, cli_option *opts) {
    const cli_option table[] = {
        {"world", CLI_OPT_INT, &a->world, 1, "W", "number of ranks (required)"},
        {"tp", CLI_OPT_INT, &a->tp, 1, "T", "tensor-parallel size (default 1)"},
        {"pp", CLI_OPT_INT, &a->pp, 1, "P", "pipeline-parallel size (default 1)"},
        {"cp", CLI_OPT_INT, &a->cp, 1, "C", "context-parallel size (default 1)"},
        {"ep", CLI_OPT_INT, &a->ep, 1, "E", "expert-parallel size (default 1)"},
        {"etp", CLI_OPT_INT, &a->etp, 1, "X", "expert tensor-parallel size (default: tp)"},
        {"vpp", CLI_OPT_INT, &a->vpp, 1, "V", "virtual pipeline chunks per stage (needs pp > 1)"},
        {"order", CLI_OPT_STRING, &a->order, 0, "S",
         "axes fastest first (default tp-cp-ep-dp-pp)"},
        {"rank", CLI_OPT_INT, &a->rank, 0, "R", "show one rank: its groups and neighbours"},
        {"json", CLI_OPT_FLAG, &a->json, 0, "", "print one JSON object instead of tables"},
        {"svg", CLI_OPT_STRING, &a->svg_path, 0, "FILE", "also draw the rank grid as SVG"},
        {"color-by", CLI_OPT_STRING, &a->color_by, 0, "KIND",
         "group kind that colours the SVG (default tp)"},
    };
    int n = (int)(sizeof table / sizeof table[0]);
    memcpy(opts, table, sizeof table);
    return n;
}

static void usage_layout(FILE *out) {
    layout_args dummy;
    cli_option opts[16];
    int n = layout_options(&dummy, opts);
    fprintf(out,
            "usage: %s layout --world W [--tp T] [--pp P] [--cp C] [--ep E] [--etp X] [--vpp V]\n"
            "                 [--order S] [--rank R] [--json] [--svg FILE [--color-by KIND]]\n\n"
            "Megatron's rank grid: every rank's coordinates and every group of parallel_state.\n"
            "world = tp*cp*dp*pp (dense) = etp*ep*edp*pp (expert); dp and edp are derived.\n\n",
            CLI_NAME);
    cli_print_options(out, opts, n);
    fprintf(out, "\ngroup kinds:");
    for (int k = 0; k < MC_GROUP_COUNT; ++k) fprintf(out, " %s", mc_group_kind_name((mc_group_kind)k));
    fprintf(out, "\n\nexample: %s layout --world 16 --tp 2 --pp 4 --rank 5\n", CLI_NAME);
}

static void layout_print_error(int status, const char *what) {
    const char *detail = mc_last_error();
    fprintf(stderr, "%s layout: %s: %s\n", CLI_NAME, what,
            (detail && detail[0]) ? detail : mc_strerror(status));
}

/* --- text output ----------------------------------------------------------------------------- */

static void layout_print_header(const mc_grid *g) {
    const mc_grid_desc *d = &g->desc;
    printf("world %d   dense: tp %d x cp %d x dp %d x pp %d   expert: etp %d x ep %d x edp %d x pp %d\n",
           d->world, d->tp, d->cp, g->dp, d->pp, d->etp, d->ep, g->edp, d->pp);
    printf("dp = world / (tp*pp*cp) = %d / %d = %d   edp = world / (etp*ep*pp) = %d / %d = %d\n",
           d->world, d->tp * d->pp * d->cp, g->dp, d->world, d->etp * d->ep * d->pp, g->edp);
    if (d->vpp > 0)
        printf("order %s   vpp %d (interleaved: %d model chunks per stage)\n", g->order, d->vpp,
               d->vpp);
    else
        printf("order %s   vpp off\n", g->order);
}

static const char *layout_stage_flag(const mc_grid *g, int pp_coord) {
    int last = g->desc.pp - 1;
    if (pp_coord == 0 && pp_coord == last) return "first,last";
    if (pp_coord == 0) return "first";
    if (pp_coord == last) return "last";
    return "-";
}

static int layout_print_rank_table(const mc_grid *g) {
    printf("\n%6s %4s %4s %4s %4s %4s %4s %4s  %s\n", "rank", "tp", "cp", "dp", "pp", "etp",
           "ep", "edp", "stage");
    for (int r = 0; r < g->desc.world; ++r) {
        mc_rank_coords c;
        int rc = mc_grid_coords(g, r, &c);
        if (rc != MC_OK) return rc;
        printf("%6d %4d %4d %4d %4d %4d %4d %4d  %s\n", c.rank, c.tp, c.cp, c.dp, c.pp, c.etp,
               c.ep, c.edp, layout_stage_flag(g, c.pp));
    }
    return MC_OK;
}

static int layout_print_groups(const mc_grid *g, int *members) {
    printf("\ngroups (kind: count x size, then every group's ranks)\n");
    for (int k = 0; k < MC_GROUP_COUNT; ++k) {
        mc_group_kind kind = (mc_group_kind)k;
        int n_groups = mc_grid_num_groups(g, kind);
        if (n_groups < 0) return n_groups;
        printf("  %-19s %4d x %-4d", mc_group_kind_name(kind), n_groups,
               mc_grid_group_size(g, kind));
        for (int i = 0; i < n_groups; ++i) {
            int n = mc_grid_group_members(g, kind, i, members, g->desc.world);
            if (n < 0) return n;
            printf(" [");
            for (int j = 0; j < n; ++j) printf(j ? ",%d" : "%d", members[j]);
            printf("]");
        }
        printf("\n");
    }
    return MC_OK;
}

static int layout_print_one_rank(const mc_grid *g, int rank, int *members) {
    mc_rank_coords c;
    int rc = mc_grid_coords(g, rank, &c);
    if (rc != MC_OK) return rc;
    int first, last, next, prev;
    rc = mc_grid_pipeline_ranks(g, rank, &first, &last, &next, &prev);
    if (rc != MC_OK) return rc;

    printf("\nrank %d\n", rank);
    printf("  dense  coords: tp %d  cp %d  dp %d  pp %d\n", c.tp, c.cp, c.dp, c.pp);
    printf("  expert coords: etp %d  ep %d  edp %d  pp %d\n", c.etp, c.ep, c.edp, c.pp);
    printf("  pipeline stage %d of %d: first stage %s, last stage %s\n", c.pp, g->desc.pp,
           c.pp == 0 ? "yes" : "no", c.pp == g->desc.pp - 1 ? "yes" : "no");
    printf("  pipeline ranks: first %d  last %d  next %d  prev %d (next/prev wrap around)\n",
           first, last, next, prev);
    printf("\n  group: index among the groups of its kind; rank: this rank's rank inside it\n");
    printf("\n  %-19s %-6s %-5s %-34s %s\n", "kind", "group", "rank", "used for", "ranks");
    for (int k = 0; k < MC_GROUP_COUNT; ++k) {
        mc_group_kind kind = (mc_group_kind)k;
        int index = -1, position = -1;
        rc = mc_grid_group_of(g, kind, rank, &index, &position);
        if (rc == MC_ERR_NOT_MEMBER) {
            printf("  %-19s %-6s %-5s %-34s %s\n", mc_group_kind_name(kind), "none", "-",
                   layout_group_purpose(kind), "-");
            continue;
        }
        if (rc != MC_OK) return rc;
        int n = mc_grid_group_members(g, kind, index, members, g->desc.world);
        if (n < 0) return n;
        char label[24], list[256];
        snprintf(label, sizeof label, "#%d", index);
        format_rank_list(list, sizeof list, members, n);
        printf("  %-19s %-6s %-5d %-34s %s\n", mc_group_kind_name(kind), label, position,
               layout_group_purpose(kind), list);
    }
    return MC_OK;
}

/* --- JSON output ----------------------------------------------------------------------------- */

static void json_write_coords(FILE *out, const mc_rank_coords *c) {
    fprintf(out, "{\"rank\":%d,\"tp\":%d,\"cp\":%d,\"dp\":%d,\"pp\":%d,\"etp\":%d,\"ep\":%d,\"edp\":%d}",
            c->rank, c->tp, c->cp, c->dp, c->pp, c->etp, c->ep, c->edp);
}

static void json_write_int_list(FILE *out, const int *v, int n) {
    fputc('[', out);
    for (int i = 0; i < n; ++i) fprintf(out, i ? ",%d" : "%d", v[i]);
    fputc(']', out);
}

static int json_write_group_kind(FILE *out, const mc_grid *g, mc_group_kind kind, int *members) {
    int n_groups = mc_grid_num_groups(g, kind);
    if (n_groups < 0) return n_groups;
    fputc('[', out);
    for (int i = 0; i < n_groups; ++i) {
        int n = mc_grid_group_members(g, kind, i, members, g->desc.world);
        if (n < 0) return n;
        if (i) fputc(',', out);
        json_write_int_list(out, members, n);
    }
    fputc(']', out);
    return MC_OK;
}

/* "rank": the chosen rank's coordinates, stage flags, pipeline neighbours and, per kind,
   {"index": i, "position": p, "members": [...]} or null when the rank is in no group. */
static int json_write_rank(FILE *out, const mc_grid *g, int rank, int *members) {
    mc_rank_coords c;
    int first, last, next, prev;
    int rc = mc_grid_coords(g, rank, &c);
    if (rc == MC_OK) rc = mc_grid_pipeline_ranks(g, rank, &first, &last, &next, &prev);
    if (rc != MC_OK) return rc;
    fprintf(out, ",\n\"rank\":{\"rank\":%d,\"coords\":", rank);
    json_write_coords(out, &c);
    fprintf(out, ",\"is_first_stage\":%s,\"is_last_stage\":%s",
            c.pp == 0 ? "true" : "false", c.pp == g->desc.pp - 1 ? "true" : "false");
    fprintf(out, ",\"pipeline\":{\"first\":%d,\"last\":%d,\"next\":%d,\"prev\":%d}", first, last,
            next, prev);
    fprintf(out, ",\"groups\":{");
    for (int k = 0; k < MC_GROUP_COUNT; ++k) {
        mc_group_kind kind = (mc_group_kind)k;
        int index = -1, position = -1;
        rc = mc_grid_group_of(g, kind, rank, &index, &position);
        fprintf(out, "%s\n  ", k ? "," : "");
        json_write_string(out, mc_group_kind_name(kind));
        if (rc == MC_ERR_NOT_MEMBER) {
            fputs(":null", out);
            continue;
        }
        if (rc != MC_OK) return rc;
        int n = mc_grid_group_members(g, kind, index, members, g->desc.world);
        if (n < 0) return n;
        fprintf(out, ":{\"index\":%d,\"position\":%d,\"members\":", index, position);
        json_write_int_list(out, members, n);
        fputc('}', out);
    }
    fputs("}}", out);
    return MC_OK;
}

static int layout_write_json(FILE *out, const mc_grid *g, int rank, int *members) {
    const mc_grid_desc *d = &g->desc;
    fprintf(out, "{\"world\":%d,\n\"sizes\":{\"tp\":%d,\"pp\":%d,\"cp\":%d,\"ep\":%d,\"etp\":%d,"
                 "\"vpp\":%d,\"dp\":%d,\"edp\":%d,\"order\":",
            d->world, d->tp, d->pp, d->cp, d->ep, d->etp, d->vpp, g->dp, g->edp);
    json_write_string(out, g->order);
    fputs("},\n\"coords\":[", out);
    for (int r = 0; r < d->world; ++r) {
        mc_rank_coords c;
        int rc = mc_grid_coords(g, r, &c);
        if (rc != MC_OK) return rc;
        fputs(r ? ",\n  " : "\n  ", out);
        json_write_coords(out, &c);
    }
    fputs("]", out);
    for (int k = 0; k < MC_GROUP_COUNT; ++k) {
        fputs(",\n", out);
        json_write_string(out, mc_group_kind_name((mc_group_kind)k));
        fputc(':', out);
        int rc = json_write_group_kind(out, g, (mc_group_kind)k, members);
        if (rc != MC_OK) return rc;
    }
    if (rank >= 0) {
        int rc = json_write_rank(out, g, rank, members);
        if (rc != MC_OK) return rc;
    }
    fputs("}\n", out);
    return MC_OK;
}

/* --- SVG output ------------------------------------------------------------------------------
   One cell per rank. Rows are pipeline stages; within a stage the cells run along
   (tp fastest, then cp, then dp), taken from each rank's coordinates rather than its id, so a
   different --order keeps the picture and moves the rank ids. Replicas of one dp index sit in a
   block with a gap after it; long rows wrap onto several lines. */

typedef struct svg_geometry {
    int detailed;          /* rank id and coordinates in each cell (small worlds) */
    int columns;           /* cells per stage: tp * cp * dp */
    int per_line;          /* cells per drawn line before wrapping */
    int lines_per_stage;
    int block;             /* cells of one dp index: tp * cp */
    int cell_w, cell_h, pad, block_gap, stage_gap;
    int left, top;         /* room for the title and the stage labels */
    int grid_w, grid_h;
} svg_geometry;

static svg_geometry svg_plan_geometry(const mc_grid *g) {
    svg_geometry s;
    memset(&s, 0, sizeof s);
    s.detailed = g->desc.world <= 64;
    s.columns = g->desc.tp * g->desc.cp * g->dp;
    s.block = g->desc.tp * g->desc.cp;
    int wrap = s.detailed ? 16 : 64;
    /* Wrap at a whole number of dp blocks when a block fits in a line. */
    if (s.columns > wrap && s.block <= wrap) wrap -= wrap % s.block;
    s.per_line = s.columns < wrap ? s.columns : wrap;
    s.lines_per_stage = (s.columns + s.per_line - 1) / s.per_line;
    s.cell_w = s.detailed ? 84 : 22;
    s.cell_h = s.detailed ? 50 : 16;
    s.pad = s.detailed ? 4 : 2;
    s.block_gap = (s.block > 1 && s.block < s.per_line) ? (s.detailed ? 12 : 6) : 0;
    s.stage_gap = s.detailed ? 18 : 8;
    s.left = 80;
    s.top = 76;
    int blocks_per_line = (s.per_line + s.block - 1) / s.block;
    s.grid_w = s.per_line * s.cell_w + (blocks_per_line - 1) * s.block_gap;
    int stage_h = s.lines_per_stage * s.cell_h + s.stage_gap;
    s.grid_h = g->desc.pp * stage_h - s.stage_gap;
    return s;
}

static int svg_stage_top(const svg_geometry *s, int pp) {
    return s->top + pp * (s->lines_per_stage * s->cell_h + s->stage_gap);
}

static void svg_cell_origin(const svg_geometry *s, const mc_grid *g, const mc_rank_coords *c,
                            int *x, int *y) {
    int column = c->tp + g->desc.tp * (c->cp + g->desc.cp * c->dp);
    int line = column / s->per_line;
    int in_line = column % s->per_line;
    int blocks_before = column / s->block - (line * s->per_line) / s->block;
    *x = s->left + in_line * s->cell_w + blocks_before * s->block_gap;
    *y = svg_stage_top(s, c->pp) + line * s->cell_h;
}

static void hsl_to_hex(double h, double sat, double light, char out[8]) {
    double c = (1.0 - fabs(2.0 * light - 1.0)) * sat;
    double hp = fmod(h, 360.0) / 60.0;
    double x = c * (1.0 - fabs(fmod(hp, 2.0) - 1.0));
    double r = 0, g = 0, b = 0;
    if (hp < 1) { r = c; g = x; }
    else if (hp < 2) { r = x; g = c; }
    else if (hp < 3) { g = c; b = x; }
    else if (hp < 4) { g = x; b = c; }
    else if (hp < 5) { r = x; b = c; }
    else { r = c; b = x; }
    double m = light - c / 2.0;
    snprintf(out, 8, "#%02x%02x%02x", (int)lround((r + m) * 255), (int)lround((g + m) * 255),
             (int)lround((b + m) * 255));
}

/* Group colours: evenly spaced hues for a few groups; for many, golden-angle steps so that
   neighbouring group indices still differ, with alternating lightness. */
static void svg_group_colour(int index, int n_groups, char out[8]) {
    if (index < 0) {
        snprintf(out, 8, "#eeeeee");
        return;
    }
    double hue = n_groups <= 12 ? 360.0 * index / (n_groups > 0 ? n_groups : 1)
                                : fmod(index * 137.508, 360.0);
    double light = (n_groups > 12 && index % 2) ? 0.70 : 0.80;
    hsl_to_hex(hue + 200.0, 0.62, light, out);
}

/* "tp1 dp0": the axes of a grid whose size is above 1 (tp alone when all are 1). */
static void svg_coords_text(char *buf, size_t cap, const char *const names[], const int coord[],
                            const int size[], int n_axes) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n_axes && used < cap; ++i) {
        if (size[i] <= 1) continue;
        used += (size_t)snprintf(buf + used, cap - used, "%s%s%d", used ? " " : "", names[i],
                                 coord[i]);
    }
    if (used == 0) snprintf(buf, cap, "%s%d", names[0], coord[0]);
}

static void svg_write_cell(FILE *out, const svg_geometry *s, const mc_grid *g,
                           const mc_rank_coords *c, int group_index, int n_groups,
                           const char *kind_name) {
    int x, y;
    svg_cell_origin(s, g, c, &x, &y);
    char fill[8];
    svg_group_colour(group_index, n_groups, fill);
    int w = s->cell_w - s->pad, h = s->cell_h - s->pad;
    const mc_grid_desc *d = &g->desc;
    fprintf(out, "<g><title>rank %d: tp %d cp %d dp %d pp %d | etp %d ep %d edp %d | %s ",
            c->rank, c->tp, c->cp, c->dp, c->pp, c->etp, c->ep, c->edp, kind_name);
    if (group_index >= 0) fprintf(out, "group %d</title>", group_index);
    else fprintf(out, "none</title>");
    fprintf(out, "<rect class=\"rank\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"%d\" "
                 "fill=\"%s\" stroke=\"%s\"%s/>",
            x, y, w, h, s->detailed ? 5 : 2, fill, group_index >= 0 ? "#555555" : "#aaaaaa",
            group_index >= 0 ? "" : " stroke-dasharray=\"3,2\"");
    int cx = x + w / 2;
    if (!s->detailed) {
        fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"tiny\">%d</text></g>\n", cx, y + h / 2 + 2,
                c->rank);
        return;
    }
    /* pp is left out: the row label names the stage. */
    static const char *const dense_names[] = {"tp", "cp", "dp"};
    static const char *const expert_names[] = {"etp", "ep", "edp"};
    int dense_coord[] = {c->tp, c->cp, c->dp};
    int dense_size[] = {d->tp, d->cp, g->dp};
    int expert_coord[] = {c->etp, c->ep, c->edp};
    int expert_size[] = {d->etp, d->ep, g->edp};
    char dense[64], expert[64];
    svg_coords_text(dense, sizeof dense, dense_names, dense_coord, dense_size, 3);
    int expert_differs = d->ep > 1 || d->etp != d->tp;
    fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"id\">%d</text>", cx,
            y + (expert_differs ? 17 : 20), c->rank);
    fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"co\">%s</text>", cx,
            y + (expert_differs ? 30 : 36), dense);
    if (expert_differs) {
        svg_coords_text(expert, sizeof expert, expert_names, expert_coord, expert_size, 3);
        fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"co\">%s</text>", cx, y + 41, expert);
    }
    fputs("</g>\n", out);
}

/* "dp 0", "dp 1", ... above the blocks when a stage fits on one line (on wrapped rows the
   cells carry their dp coordinate instead). */
static void svg_write_block_labels(FILE *out, const svg_geometry *s, const mc_grid *g) {
    if (s->block_gap == 0 || s->lines_per_stage > 1) return;
    int blocks = s->per_line / s->block;
    for (int b = 0; b < blocks && b < g->dp; ++b) {
        int x = s->left + b * (s->block * s->cell_w + s->block_gap) +
                (s->block * s->cell_w - s->pad) / 2;
        fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"block\">dp %d</text>\n", x, s->top - 6, b);
    }
}

static void svg_write_stage_labels(FILE *out, const svg_geometry *s, const mc_grid *g) {
    for (int pp = 0; pp < g->desc.pp; ++pp) {
        int y = svg_stage_top(s, pp) + (s->cell_h - s->pad) / 2;
        fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"stage\">pp %d</text>\n", s->left - 10, y,
                pp);
        const char *flag = layout_stage_flag(g, pp);
        if (strcmp(flag, "-") != 0)
            fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"flag\">%s</text>\n", s->left - 10,
                    y + 12, flag);
    }
}

/* The legend lists at most SVG_LEGEND_MAX groups, SVG_LEGEND_W pixels apart in rows. */
enum { SVG_LEGEND_MAX = 48, SVG_LEGEND_W = 300, SVG_LEGEND_H = 16 };

static int svg_legend_per_row(const svg_geometry *s, int width) {
    int per_row = (width - s->left) / SVG_LEGEND_W;
    return per_row < 1 ? 1 : per_row;
}

/* Height of the legend: its heading, one row per per_row groups, and the "more" line. */
static int svg_legend_height(int n_groups, int per_row) {
    int listed = n_groups < SVG_LEGEND_MAX ? n_groups : SVG_LEGEND_MAX;
    return 10 + (listed + per_row - 1) / per_row * SVG_LEGEND_H +
           (listed < n_groups ? SVG_LEGEND_H : 0);
}

/* A swatch and the members of each group of the colouring kind, in rows under the grid. */
static void svg_write_legend(FILE *out, const svg_geometry *s, const mc_grid *g,
                             mc_group_kind kind, int y0, int width, int *members) {
    const int entry_w = SVG_LEGEND_W, entry_h = SVG_LEGEND_H;
    int n_groups = mc_grid_num_groups(g, kind);
    if (n_groups < 0) return;
    int listed = n_groups < SVG_LEGEND_MAX ? n_groups : SVG_LEGEND_MAX;
    int per_row = svg_legend_per_row(s, width);
    fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"head\">colour = %s group: %d groups of %d "
                 "rank%s</text>\n",
            s->left, y0, mc_group_kind_name(kind), n_groups, mc_grid_group_size(g, kind),
            mc_grid_group_size(g, kind) == 1 ? "" : "s");
    for (int i = 0; i < listed; ++i) {
        int n = mc_grid_group_members(g, kind, i, members, g->desc.world);
        if (n < 0) return;
        int x = s->left + (i % per_row) * entry_w;
        int y = y0 + 10 + (i / per_row) * entry_h;
        char fill[8], list[32];
        svg_group_colour(i, n_groups, fill);
        format_rank_list(list, sizeof list, members, n);
        fprintf(out, "<rect class=\"swatch\" x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" "
                     "fill=\"%s\" stroke=\"#555555\"/>",
                x, y, fill);
        fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"legend\">%s #%d %s</text>\n", x + 17,
                y + 10, mc_group_kind_name(kind), i, list);
    }
    if (listed < n_groups) {
        int rows = (listed + per_row - 1) / per_row;
        fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"legend\">... and %d more groups "
                     "(hover a cell for its group)</text>\n",
                s->left, y0 + 20 + rows * entry_h, n_groups - listed);
    }
}

static int layout_write_svg(const char *path, const mc_grid *g, mc_group_kind kind, int *members) {
    FILE *out = fopen(path, "w");
    if (!out) {
        fprintf(stderr, "%s layout: cannot write --svg %s: %s\n", CLI_NAME, path, strerror(errno));
        return MC_ERR_IO;
    }
    svg_geometry s = svg_plan_geometry(g);
    int n_groups = mc_grid_num_groups(g, kind);
    int width = s.left + s.grid_w + 24;
    if (width < s.left + 4 * SVG_LEGEND_W) width = s.left + 4 * SVG_LEGEND_W;
    int legend_top = s.top + s.grid_h + 36;
    int height = legend_top + svg_legend_height(n_groups, svg_legend_per_row(&s, width)) + 20;
    const mc_grid_desc *d = &g->desc;
    int status = MC_OK;

    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                 "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
            width, height, width, height);
    fputs("<style>text{fill:#222222}"
          ".id{font-size:15px;font-weight:bold;text-anchor:middle}"
          ".co{font-size:9px;text-anchor:middle;font-family:DejaVu Sans Mono,monospace}"
          ".tiny{font-size:7px;text-anchor:middle}"
          ".stage{font-size:12px;font-weight:bold;text-anchor:end}"
          ".flag{font-size:10px;fill:#666666;text-anchor:end}"
          ".title{font-size:16px;font-weight:bold}.sub{font-size:12px;fill:#444444}"
          ".block{font-size:11px;fill:#555555;text-anchor:middle}"
          ".head{font-size:12px;font-weight:bold}.legend{font-size:10px}</style>\n", out);
    fprintf(out, "<rect class=\"background\" width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
    fprintf(out, "<text x=\"%d\" y=\"24\" class=\"title\">world %d = tp %d x cp %d x dp %d x pp %d",
            s.left, d->world, d->tp, d->cp, g->dp, d->pp);
    if (d->ep > 1 || d->etp != d->tp)
        fprintf(out, "   (expert: etp %d x ep %d x edp %d x pp %d)", d->etp, d->ep, g->edp, d->pp);
    fputs("</text>\n", out);
    fprintf(out, "<text x=\"%d\" y=\"44\" class=\"sub\">order ", s.left);
    xml_write_escaped(out, g->order);
    if (d->vpp > 0) fprintf(out, ", vpp %d", d->vpp);
    fprintf(out, "; one cell per rank, rows = pipeline stages, columns = tp, then cp, then dp; "
                 "coloured by %s group</text>\n",
            mc_group_kind_name(kind));
    svg_write_stage_labels(out, &s, g);
    svg_write_block_labels(out, &s, g);

    for (int r = 0; r < d->world && status == MC_OK; ++r) {
        mc_rank_coords c;
        int index = -1;
        status = mc_grid_coords(g, r, &c);
        if (status != MC_OK) break;
        int rc = mc_grid_group_of(g, kind, r, &index, NULL);
        if (rc != MC_OK && rc != MC_ERR_NOT_MEMBER) status = rc;
        else svg_write_cell(out, &s, g, &c, index, n_groups, mc_group_kind_name(kind));
    }
    if (status == MC_OK) svg_write_legend(out, &s, g, kind, legend_top, width, members);
    fputs("</svg>\n", out);
    if (fclose(out) != 0 && status == MC_OK) {
        fprintf(stderr, "%s layout: writing --svg %s failed: %s\n", CLI_NAME, path, strerror(errno));
        status = MC_ERR_IO;
    }
    return status;
}

/* --- the subcommand ----------------------------------------------------------------------- */

static int layout_check_args(const layout_args *a, mc_group_kind *color_kind) {
    if (a->world == 0) {
        fprintf(stderr, "%s layout: --world W is required\n", CLI_NAME);
        return -1;
    }
    const char *name = a->color_by ? a->color_by : "tp";
    int kind = mc_group_kind_from_name(name);
    if (kind < 0) {
        fprintf(stderr, "%s layout: --color-by '%s' is not a group kind (one of:", CLI_NAME, name);
        for (int k = 0; k < MC_GROUP_COUNT; ++k)
            fprintf(stderr, " %s", mc_group_kind_name((mc_group_kind)k));
        fprintf(stderr, ")\n");
        return -1;
    }
    *color_kind = (mc_group_kind)kind;
    return 0;
}

static int cmd_layout(int argc, char **argv) {
    layout_args a;
    memset(&a, 0, sizeof a);
    a.rank = -1;
    cli_option opts[16];
    int n_opts = layout_options(&a, opts);
    cli_parse_result parsed = cli_parse("layout", opts, n_opts, argc, argv);
    if (parsed == CLI_WANTS_HELP) {
        usage_layout(stdout);
        return CLI_EXIT_OK;
    }
    mc_group_kind color_kind = MC_GROUP_TP;
    if (parsed != CLI_PARSED || layout_check_args(&a, &color_kind) != 0) {
        fputc('\n', stderr);
        usage_layout(stderr);
        return CLI_EXIT_USAGE;
    }

    mc_grid grid;
    mc_grid_desc desc = {.world = a.world, .tp = a.tp, .pp = a.pp, .vpp = a.vpp, .cp = a.cp,
                         .ep = a.ep, .etp = a.etp, .order = a.order};
    int rc = mc_grid_init(&grid, &desc);
    if (rc != MC_OK) {
        layout_print_error(rc, "invalid layout");
        return CLI_EXIT_USAGE;
    }
    if (a.rank >= grid.desc.world) {
        fprintf(stderr, "%s layout: --rank %d is not a rank of world %d (ranks are 0..%d)\n",
                CLI_NAME, a.rank, grid.desc.world, grid.desc.world - 1);
        return CLI_EXIT_USAGE;
    }

    int *members = malloc((size_t)grid.desc.world * sizeof *members);
    if (!members) {
        fprintf(stderr, "%s layout: out of memory for world %d\n", CLI_NAME, grid.desc.world);
        return CLI_EXIT_FAILURE;
    }
    if (a.json) {
        rc = layout_write_json(stdout, &grid, a.rank, members);
    } else {
        layout_print_header(&grid);
        if (a.rank >= 0) {
            rc = layout_print_one_rank(&grid, a.rank, members);
        } else {
            rc = layout_print_rank_table(&grid);
            if (rc == MC_OK) rc = layout_print_groups(&grid, members);
        }
    }
    int exit_code = CLI_EXIT_OK;
    if (rc != MC_OK) {
        layout_print_error(rc, "computing the layout failed");
        exit_code = CLI_EXIT_FAILURE;
    }
    if (exit_code == CLI_EXIT_OK && a.svg_path) {
        if (layout_write_svg(a.svg_path, &grid, color_kind, members) != MC_OK)
            exit_code = CLI_EXIT_FAILURE;
        else
            fprintf(stderr, "%s layout: wrote %s (%d ranks, coloured by %s groups)\n", CLI_NAME,
                    a.svg_path, grid.desc.world, mc_group_kind_name(color_kind));
    }
    free(members);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s layout: writing to stdout failed\n", CLI_NAME);
        exit_code = CLI_EXIT_FAILURE;
    }
    return exit_code;
}

/* ---------------------------------------------------------------------------------------------
   schedule: the op order of each pipeline stage (no pipelining, 1F1B, interleaved 1F1B). */

/* The most ops (pp x ops per stage) `schedule` prints: 4M ops, about 100 MB of memory. */
#define SCHEDULE_MAX_OPS (1 << 22)

typedef struct schedule_args {
    int pp, microbatches, vpp, group_size;
    int forward_only, json;
    const char *svg_path;
} schedule_args;

static int schedule_options(schedule_args *a, cli_option *opts) {
    const cli_option table[] = {
        {"pp", CLI_OPT_INT, &a->pp, 1, "P", "pipeline stages (required)"},
        {"microbatches", CLI_OPT_INT, &a->microbatches, 1, "M", "micro-batches per step (required)"},
        {"vpp", CLI_OPT_INT, &a->vpp, 1, "V", "model chunks per stage: interleaved when >= 2"},
        {"group-size", CLI_OPT_INT, &a->group_size, 1, "N",
         "micro-batches per interleaving group (default: pp)"},
        {"forward-only", CLI_OPT_FLAG, &a->forward_only, 0, "", "forwards only (evaluation)"},
        {"json", CLI_OPT_FLAG, &a->json, 0, "", "print {\"stages\": [[\"F0\", ...], ...]}"},
        {"svg", CLI_OPT_STRING, &a->svg_path, 0, "FILE", "also draw the timeline as SVG"},
    };
    int n = (int)(sizeof table / sizeof table[0]);
    memcpy(opts, table, sizeof table);
    return n;
}

static void usage_schedule(FILE *out) {
    schedule_args dummy;
    cli_option opts[16];
    int n = schedule_options(&dummy, opts);
    fprintf(out,
            "usage: %s schedule --pp P --microbatches M [--vpp V] [--group-size N]\n"
            "                   [--forward-only] [--json] [--svg FILE]\n\n"
            "The forward (F) and backward (B) order of every pipeline stage in Megatron's\n"
            "schedules: no pipelining (pp 1), 1F1B (warmup min(pp - r - 1, M) on stage r) and\n"
            "interleaved 1F1B (vpp >= 2; warmup (pp - r - 1) * 2 + (vpp - 1) * N; needs\n"
            "pp <= N <= M and M mod N either 0 or >= pp). Ops read F<micro-batch>, or\n"
            "F<micro-batch>.<chunk> when interleaved. The bubble comes from a simulation with\n"
            "unit forwards, backwards of 2 and free communication.\n\n",
            CLI_NAME);
    cli_print_options(out, opts, n);
    fprintf(out, "\nexample: %s schedule --pp 2 --microbatches 5 --vpp 2 --group-size 3\n", CLI_NAME);
}

static void schedule_op_text(const mc_sched_op *op, int interleaved, char *buf, size_t cap) {
    if (interleaved)
        snprintf(buf, cap, "%c%d.%d", op->kind, op->microbatch, op->chunk);
    else
        snprintf(buf, cap, "%c%d", op->kind, op->microbatch);
}

/* Every stage's ops, stage-major (pp rows of *count), and each stage's warmup. */
static int schedule_collect(const mc_schedule_desc *base, mc_sched_op **ops, int *warmup,
                            int *count) {
    mc_schedule_desc d = *base;
    int n = mc_schedule_ops(&d, NULL, 0, NULL);
    if (n < 0) return n;
    *count = n;
    *ops = malloc(sizeof **ops * (size_t)n * (size_t)base->pp);
    if (!*ops) return MC_ERR_NO_MEMORY;
    for (int r = 0; r < base->pp; ++r) {
        d.pp_rank = r;
        int rc = mc_schedule_ops(&d, *ops + (size_t)r * (size_t)n, n, &warmup[r]);
        if (rc < 0) return rc;
    }
    return MC_OK;
}

static void schedule_write_json(FILE *out, const mc_sched_op *ops, int pp, int count,
                                int interleaved) {
    fputs("{\"stages\": [", out);
    for (int r = 0; r < pp; ++r) {
        fputs(r ? ",\n  [" : "\n  [", out);
        for (int i = 0; i < count; ++i) {
            char op[32];
            schedule_op_text(&ops[(size_t)r * (size_t)count + (size_t)i], interleaved, op,
                             sizeof op);
            fprintf(out, i ? ", \"%s\"" : "\"%s\"", op);
        }
        fputc(']', out);
    }
    fputs("\n]}\n", out);
}

/* The Megatron paper's bubble over compute: (p - 1) / (v m); 0 without pipelining. */
static double schedule_paper_ratio(const mc_schedule_desc *d) {
    int v = d->vpp > 1 ? d->vpp : 1;
    return (double)(d->pp - 1) / ((double)v * d->num_microbatches);
}

static void schedule_print_text(const mc_schedule_desc *d, const char *name, const mc_sched_op *ops,
                                const int *warmup, int count, const mc_schedule_timing *t) {
    int interleaved = d->vpp > 1;
    printf("schedule %s: pp %d, microbatches %d", name, d->pp, d->num_microbatches);
    if (interleaved) printf(", vpp %d, group size %d", d->vpp, d->group_size ? d->group_size : d->pp);
    printf("%s; %d ops per stage\n", d->forward_only ? ", forward only" : "", count);
    if (interleaved)
        printf("F3.1 = forward of micro-batch 3 on model chunk 1 (virtual stage 1 * pp + stage)\n");
    for (int r = 0; r < d->pp; ++r) {
        printf("stage %d  warmup %2d |", r, warmup[r]);
        for (int i = 0; i < count; ++i) {
            char op[32];
            schedule_op_text(&ops[(size_t)r * (size_t)count + (size_t)i], interleaved, op,
                             sizeof op);
            printf(" %s", op);
        }
        printf("\n");
    }
    if (!t) return;
    printf("bubble (forward 1, backward %s, free communication): makespan %g, idle %.1f%% of "
           "each stage's time, idle / compute %.4f",
           d->forward_only ? "-" : "2", t->makespan, 100.0 * t->bubble_fraction, t->bubble_ratio);
    if (!d->forward_only && d->pp > 1)
        printf(" (paper: (p - 1) / %s = %.4f)", interleaved ? "(v m)" : "m",
               schedule_paper_ratio(d));
    printf("\n");
}

/* --- SVG timeline ---------------------------------------------------------------------------- */

enum { SCHED_SVG_LEFT = 90, SCHED_SVG_TOP = 70, SCHED_SVG_ROW = 34, SCHED_SVG_BOX = 26 };

static void schedule_svg_box(FILE *out, const mc_sched_op *op, int stage, int interleaved,
                             double begin, double length, double scale, int v) {
    double x = SCHED_SVG_LEFT + begin * scale, w = length * scale - 1.0;
    int y = SCHED_SVG_TOP + stage * SCHED_SVG_ROW;
    /* Forwards blue, backwards green; later chunks lighter. */
    double light = 0.55 + 0.3 * (v > 1 ? (double)op->chunk / (v - 1) : 0.0);
    char fill[8], label[32];
    hsl_to_hex(op->kind == 'F' ? 215.0 : 135.0, 0.55, light, fill);
    schedule_op_text(op, interleaved, label, sizeof label);
    fprintf(out, "<g><title>stage %d: %s, %s micro-batch %d chunk %d, t = %g .. %g</title>", stage,
            label, op->kind == 'F' ? "forward" : "backward", op->microbatch, op->chunk, begin,
            begin + length);
    fprintf(out, "<rect class=\"op\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"/>",
            x, y, w > 0.5 ? w : 0.5, SCHED_SVG_BOX, fill);
    if (w >= 8.0 * (double)strlen(label) * 0.75)
        fprintf(out, "<text x=\"%.2f\" y=\"%d\" class=\"lab\">%s</text>", x + w / 2,
                y + SCHED_SVG_BOX / 2 + 4, label);
    fputs("</g>\n", out);
}

static int schedule_write_svg(const char *path, const mc_schedule_desc *d, const char *name,
                              const mc_sched_op *ops, int count, const double *start,
                              const mc_schedule_timing *t) {
    FILE *out = fopen(path, "w");
    if (!out) {
        fprintf(stderr, "%s schedule: cannot write --svg %s: %s\n", CLI_NAME, path,
                strerror(errno));
        return MC_ERR_IO;
    }
    double scale = 1600.0 / t->makespan;
    if (scale > 28.0) scale = 28.0;
    if (scale < 1.0) scale = 1.0;
    int interleaved = d->vpp > 1, v = interleaved ? d->vpp : 1;
    int width = SCHED_SVG_LEFT + (int)ceil(t->makespan * scale) + 40;
    if (width < 720) width = 720;
    int axis_y = SCHED_SVG_TOP + d->pp * SCHED_SVG_ROW + 8;
    int height = axis_y + 56;
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                 "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
            width, height, width, height);
    fputs("<style>text{fill:#222222}.title{font-size:16px;font-weight:bold}"
          ".sub{font-size:12px;fill:#444444}.stage{font-size:12px;font-weight:bold;"
          "text-anchor:end}.lab{font-size:10px;text-anchor:middle}"
          ".tick{font-size:10px;fill:#555555;text-anchor:middle}"
          ".op{stroke:#333333;stroke-width:0.5}</style>\n", out);
    fputs("<rect class=\"background\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n", out);
    fprintf(out, "<text x=\"%d\" y=\"24\" class=\"title\">%s: pp %d, microbatches %d", SCHED_SVG_LEFT,
            name, d->pp, d->num_microbatches);
    if (interleaved) fprintf(out, ", vpp %d", d->vpp);
    if (d->forward_only) fputs(", forward only", out);
    fputs("</text>\n", out);
    fprintf(out, "<text x=\"%d\" y=\"44\" class=\"sub\">forward = 1, backward = %s, free "
                 "communication; blue F, green B%s; makespan %g, idle %.1f%% per stage</text>\n",
            SCHED_SVG_LEFT, d->forward_only ? "-" : "2",
            interleaved ? " (lighter = later chunk)" : "", t->makespan,
            100.0 * t->bubble_fraction);
    for (int r = 0; r < d->pp; ++r) {
        fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"stage\">stage %d</text>\n",
                SCHED_SVG_LEFT - 10, SCHED_SVG_TOP + r * SCHED_SVG_ROW + SCHED_SVG_BOX / 2 + 4, r);
        for (int i = 0; i < count; ++i) {
            const mc_sched_op *op = &ops[(size_t)r * (size_t)count + (size_t)i];
            double begin = start[(size_t)r * (size_t)count + (size_t)i];
            schedule_svg_box(out, op, r, interleaved, begin, op->kind == 'F' ? 1.0 : 2.0, scale,
                             v);
        }
    }
    /* Time axis with a tick about every 60 pixels, on whole time units. */
    int step = (int)ceil(60.0 / scale);
    fprintf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#555555\"/>\n",
            SCHED_SVG_LEFT, axis_y, SCHED_SVG_LEFT + t->makespan * scale, axis_y);
    for (int tick = 0; tick <= (int)t->makespan; tick += step)
        fprintf(out, "<text x=\"%.2f\" y=\"%d\" class=\"tick\">%d</text>\n",
                SCHED_SVG_LEFT + tick * scale, axis_y + 14, tick);
    fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"sub\">time (forward = 1)</text>\n",
            SCHED_SVG_LEFT, axis_y + 34);
    fputs("</svg>\n", out);
    if (fclose(out) != 0) {
        fprintf(stderr, "%s schedule: writing --svg %s failed: %s\n", CLI_NAME, path,
                strerror(errno));
        return MC_ERR_IO;
    }
    return MC_OK;
}

/* --- the subcommand ----------------------------------------------------------------------- */

static int cmd_schedule(int argc, char **argv) {
    schedule_args a;
    memset(&a, 0, sizeof a);
    cli_option opts[16];
    int n_opts = schedule_options(&a, opts);
    cli_parse_result parsed = cli_parse("schedule", opts, n_opts, argc, argv);
    if (parsed == CLI_WANTS_HELP) {
        usage_schedule(stdout);
        return CLI_EXIT_OK;
    }
    if (parsed == CLI_PARSED && (a.pp == 0 || a.microbatches == 0)) {
        fprintf(stderr, "%s schedule: --pp P and --microbatches M are required\n", CLI_NAME);
        parsed = CLI_BAD_USAGE;
    }
    if (parsed != CLI_PARSED) {
        fputc('\n', stderr);
        usage_schedule(stderr);
        return CLI_EXIT_USAGE;
    }
    mc_schedule_desc d = {.pp = a.pp, .num_microbatches = a.microbatches, .vpp = a.vpp,
                          .group_size = a.group_size, .forward_only = a.forward_only};
    const char *name = mc_schedule_name(&d);
    if (!name) {
        fprintf(stderr, "%s schedule: invalid schedule: %s\n", CLI_NAME, mc_last_error());
        return CLI_EXIT_USAGE;
    }
    /* Bounded output: pp rows of ops, each op printed and simulated once (linear in pp). */
    long long total_ops = (long long)mc_schedule_ops(&d, NULL, 0, NULL) * a.pp;
    if (total_ops > SCHEDULE_MAX_OPS) {
        fprintf(stderr, "%s schedule: pp (%d) x %lld ops per stage = %lld ops is more than this "
                "command prints (%d); ask for fewer stages or micro-batches\n", CLI_NAME, a.pp,
                total_ops / a.pp, total_ops, SCHEDULE_MAX_OPS);
        return CLI_EXIT_USAGE;
    }
    mc_sched_op *ops = NULL;
    double *start = NULL;
    int *warmup = calloc((size_t)a.pp, sizeof *warmup), count = 0;
    int rc = warmup ? schedule_collect(&d, &ops, warmup, &count) : MC_ERR_NO_MEMORY;
    mc_schedule_timing timing;
    int want_timing = !a.json || a.svg_path;
    if (rc == MC_OK && want_timing) {
        long long cells = (long long)count * a.pp;
        start = cells <= INT_MAX ? malloc(sizeof *start * (size_t)cells) : NULL;
        rc = start ? mc_schedule_simulate(&d, 1.0, 2.0, start, (int)cells, &timing)
                   : MC_ERR_NO_MEMORY;
    }
    int exit_code = CLI_EXIT_OK;
    if (rc != MC_OK) {
        fprintf(stderr, "%s schedule: %s\n", CLI_NAME,
                mc_last_error()[0] ? mc_last_error() : mc_strerror(rc));
        exit_code = CLI_EXIT_FAILURE;
    } else {
        if (a.json)
            schedule_write_json(stdout, ops, a.pp, count, a.vpp > 1);
        else
            schedule_print_text(&d, name, ops, warmup, count, &timing);
        if (a.svg_path) {
            if (schedule_write_svg(a.svg_path, &d, name, ops, count, start, &timing) != MC_OK)
                exit_code = CLI_EXIT_FAILURE;
            else
                fprintf(stderr, "%s schedule: wrote %s (%d stages x %d ops)\n", CLI_NAME,
                        a.svg_path, a.pp, count);
        }
    }
    free(ops);
    free(start);
    free(warmup);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s schedule: writing to stdout failed\n", CLI_NAME);
        exit_code = CLI_EXIT_FAILURE;
    }
    return exit_code;
}

/* ---------------------------------------------------------------------------------------------
   microbatches: Megatron's micro-batch calculator, consumed samples -> global batch and M. */

enum { MB_MAX_POINTS = 100000 };

typedef struct microbatches_args {
    int gbs, mbs, dp, seq_length, decrease, json;
    const char *rampup, *step_schedule, *consumed;
} microbatches_args;

static int microbatches_options(microbatches_args *a, cli_option *opts) {
    const cli_option table[] = {
        {"gbs", CLI_OPT_INT, &a->gbs, 1, "G", "global batch size (required without --step-schedule)"},
        {"mbs", CLI_OPT_INT, &a->mbs, 1, "B", "micro batch size (required)"},
        {"dp", CLI_OPT_INT, &a->dp, 1, "D", "data-parallel size, world / (tp*pp*cp) (required)"},
        {"rampup", CLI_OPT_STRING, &a->rampup, 0, "S,I,N",
         "ramp up from S by I over N samples (core_v0.17)"},
        {"step-schedule", CLI_OPT_STRING, &a->step_schedule, 0, "STR",
         "\"THRESHOLD:BS ...\", suffixes K M B T (HEAD)"},
        {"seq-length", CLI_OPT_INT, &a->seq_length, 1, "L",
         "step-schedule thresholds are tokens of L-token samples"},
        {"decrease-batch-size-if-needed", CLI_OPT_FLAG, &a->decrease, 0, "",
         "round the running batch down to a multiple of mbs*dp"},
        {"consumed", CLI_OPT_STRING, &a->consumed, 0, "C1,C2,...",
         "consumed samples to show (default: where the batch changes)"},
        {"json", CLI_OPT_FLAG, &a->json, 0, "", "print a JSON list of rows"},
    };
    int n = (int)(sizeof table / sizeof table[0]);
    memcpy(opts, table, sizeof table);
    return n;
}

static void usage_microbatches(FILE *out) {
    microbatches_args dummy;
    cli_option opts[16];
    int n = microbatches_options(&dummy, opts);
    fprintf(out,
            "usage: %s microbatches --gbs G --mbs B --dp D [--rampup S,I,N]\n"
            "                       [--step-schedule STR [--seq-length L]]\n"
            "                       [--decrease-batch-size-if-needed] [--consumed C1,C2,...] [--json]\n\n"
            "Megatron's micro-batch calculator: global batch = micro batch x num_microbatches x dp.\n"
            "Each row is what update(consumed samples, consistency check) gives.\n\n",
            CLI_NAME);
    cli_print_options(out, opts, n);
    fprintf(out, "\nexamples: %s microbatches --gbs 512 --mbs 4 --dp 16\n"
                 "          %s microbatches --gbs 64 --mbs 2 --dp 4 --rampup 16,16,300\n",
            CLI_NAME, CLI_NAME);
}

/* Comma-separated non-negative integers; returns the count, or -1 (message printed). */
static int parse_count_list(const char *option, const char *text, long long *out, int cap) {
    int n = 0;
    const char *p = text;
    for (;;) {
        char *end = NULL;
        errno = 0;
        long long value = strtoll(p, &end, 10);
        if (end == p || errno == ERANGE || value < 0 || (*end != ',' && *end != '\0')) {
            fprintf(stderr, "%s microbatches: --%s expects comma-separated integers >= 0, got '%s'\n",
                    CLI_NAME, option, text);
            return -1;
        }
        if (n == cap) {
            fprintf(stderr, "%s microbatches: --%s takes at most %d values\n", CLI_NAME, option,
                    cap);
            return -1;
        }
        out[n++] = value;
        if (*end == '\0') return n;
        p = end + 1;
    }
}

static int microbatches_check_args(const microbatches_args *a, mc_microbatch_desc *d,
                                   long long *rampup) {
    if (a->mbs == 0 || a->dp == 0 || (a->gbs == 0 && !a->step_schedule)) {
        fprintf(stderr, "%s microbatches: --mbs, --dp and (without --step-schedule) --gbs are "
                        "required\n", CLI_NAME);
        return -1;
    }
    if (a->rampup) {
        int n = parse_count_list("rampup", a->rampup, rampup, 3);
        if (n < 0) return -1;
        if (n != 3) {
            fprintf(stderr, "%s microbatches: --rampup expects START,INCREMENT,SAMPLES (3 "
                            "entries, like Megatron's --rampup-batch-size), got '%s'\n",
                    CLI_NAME, a->rampup);
            return -1;
        }
        if (rampup[0] > INT_MAX || rampup[1] > INT_MAX) {
            fprintf(stderr, "%s microbatches: --rampup batch sizes must fit in an int\n", CLI_NAME);
            return -1;
        }
    }
    memset(d, 0, sizeof *d);
    d->global_batch_size = a->gbs;
    d->micro_batch_size = a->mbs;
    d->data_parallel_size = a->dp;
    d->decrease_batch_size_if_needed = a->decrease;
    d->step_schedule = a->step_schedule;
    d->seq_length = a->seq_length;
    if (a->rampup) {
        d->rampup.start = (int)rampup[0];
        d->rampup.increment = (int)rampup[1];
        d->rampup.samples = rampup[2];
    }
    return 0;
}

typedef struct microbatch_row {
    long long consumed;
    int global_batch, running_batch, num_microbatches;
} microbatch_row;

static void microbatches_print_text(const mc_microbatch_calc *c, const microbatch_row *rows,
                                    int n) {
    const mc_microbatch_desc *d = &c->desc;
    int unit = d->micro_batch_size * d->data_parallel_size;
    switch (c->mode) {
        case MC_MICROBATCH_RAMPUP:
            printf("ramp-up from %d by %d over %lld samples to %d", d->rampup.start,
                   d->rampup.increment, d->rampup.samples, c->global_batch_size);
            break;
        case MC_MICROBATCH_STEP:
            printf("step schedule of %d entries ending at %d%s", c->n_steps, c->global_batch_size,
                   d->seq_length > 0 ? " (thresholds converted from tokens)" : "");
            break;
        default:
            printf("constant global batch %d", c->global_batch_size);
    }
    printf("; micro batch %d x dp %d = %d samples per micro-batch step\n", d->micro_batch_size,
           d->data_parallel_size, unit);
    printf("global batch = micro batch x num_microbatches x dp%s\n\n",
           d->decrease_batch_size_if_needed ? " (running batch rounded down to a multiple)" : "");
    printf("%14s %13s", "consumed", "global_batch");
    if (d->decrease_batch_size_if_needed) printf(" %13s", "running_batch");
    printf(" %17s\n", "num_microbatches");
    for (int i = 0; i < n; ++i) {
        printf("%14lld %13d", rows[i].consumed, rows[i].global_batch);
        if (d->decrease_batch_size_if_needed) printf(" %13d", rows[i].running_batch);
        printf(" %17d\n", rows[i].num_microbatches);
    }
}

static void microbatches_write_json(FILE *out, const microbatch_row *rows, int n) {
    fputc('[', out);
    for (int i = 0; i < n; ++i)
        fprintf(out, "%s\n  {\"consumed\": %lld, \"global_batch\": %d, \"num_microbatches\": %d}",
                i ? "," : "", rows[i].consumed, rows[i].global_batch, rows[i].num_microbatches);
    fputs("\n]\n", out);
}

static int cmd_microbatches(int argc, char **argv) {
    microbatches_args a;
    memset(&a, 0, sizeof a);
    cli_option opts[16];
    int n_opts = microbatches_options(&a, opts);
    cli_parse_result parsed = cli_parse("microbatches", opts, n_opts, argc, argv);
    if (parsed == CLI_WANTS_HELP) {
        usage_microbatches(stdout);
        return CLI_EXIT_OK;
    }
    mc_microbatch_desc desc;
    long long rampup[3];
    if (parsed != CLI_PARSED || microbatches_check_args(&a, &desc, rampup) != 0) {
        fputc('\n', stderr);
        usage_microbatches(stderr);
        return CLI_EXIT_USAGE;
    }
    long long *points = malloc(sizeof *points * MB_MAX_POINTS);
    microbatch_row *rows = malloc(sizeof *rows * MB_MAX_POINTS);
    if (!points || !rows) {
        free(points);
        free(rows);
        fprintf(stderr, "%s microbatches: out of memory\n", CLI_NAME);
        return CLI_EXIT_FAILURE;
    }
    int exit_code = CLI_EXIT_OK, n = 0;
    mc_microbatch_calc calc;
    int rc = mc_microbatch_init(&calc, &desc);
    if (rc != MC_OK) {
        fprintf(stderr, "%s microbatches: invalid calculator: %s\n", CLI_NAME, mc_last_error());
        exit_code = CLI_EXIT_USAGE;
    } else if (a.consumed) {
        n = parse_count_list("consumed", a.consumed, points, MB_MAX_POINTS);
        if (n < 0) {
            fputc('\n', stderr);
            usage_microbatches(stderr);
            exit_code = CLI_EXIT_USAGE;
        }
    } else {
        n = mc_microbatch_change_points(&calc, points, MB_MAX_POINTS);
        if (n > MB_MAX_POINTS) {
            fprintf(stderr, "%s microbatches: the batch changes %d times; showing the first %d "
                            "(pick rows with --consumed)\n",
                    CLI_NAME, n, MB_MAX_POINTS);
            n = MB_MAX_POINTS;
        }
    }
    /* Every row is checked as the training loop checks it; the first failure ends the run
       before anything is printed, so that stdout holds either the table or nothing. */
    for (int i = 0; exit_code == CLI_EXIT_OK && i < n; ++i) {
        rc = mc_microbatch_update(&calc, points[i], 1);
        if (rc != MC_OK) {
            fprintf(stderr, "%s microbatches: at %lld consumed samples: %s\n", CLI_NAME,
                    points[i], mc_last_error());
            exit_code = CLI_EXIT_USAGE;
            break;
        }
        rows[i].consumed = points[i];
        rows[i].global_batch = calc.current_global_batch_size;
        rows[i].running_batch = calc.current_running_global_batch_size;
        rows[i].num_microbatches = calc.num_microbatches;
    }
    if (exit_code == CLI_EXIT_OK) {
        if (a.json)
            microbatches_write_json(stdout, rows, n);
        else
            microbatches_print_text(&calc, rows, n);
        if (fflush(stdout) != 0 || ferror(stdout)) {
            fprintf(stderr, "%s microbatches: writing to stdout failed\n", CLI_NAME);
            exit_code = CLI_EXIT_FAILURE;
        }
    }
    free(points);
    free(rows);
    return exit_code;
}

/* ---------------------------------------------------------------------------------------------
   memory: the bytes every rank holds (mc_memory_estimate), per pipeline stage, with each term's
   formula and this config's numbers; pretrain_gpt's flags, parsed and checked by its own code. */

enum { MEM_MAX_SHOWN = 64 };   /* stages shown in full; beyond, the first, middle and last few */

typedef struct memory_args {
    int world, json;
    const char *svg_path;
    args gpt;                  /* pretrain_gpt's flags */
} memory_args;

static void usage_memory(FILE *out) {
    fprintf(out,
            "usage: %s memory [--world N] [--json] [--svg FILE] [pretrain_gpt's flags]\n\n"
            "Per pipeline stage, the bytes each rank holds: parameters, gradients, optimizer\n"
            "state, activations and communication buffers, every term as its formula and with\n"
            "this config's numbers. Two models side by side: the paper (Megatron-LM; Korthikanti\n"
            "et al. 2022: s*b*h*(34 + 5*a*s/h) per layer, /t with SP, 34*s*b*h/t with selective\n"
            "recompute, 2*s*b*h with full recompute; micro-batches in flight under 1F1B and\n"
            "interleaving) and this implementation (what pretrain_gpt allocates, byte for byte).\n"
            "M = --global-batch-size / (--micro-batch-size x dp). Bad flags are refused exactly as\n"
            "pretrain_gpt refuses them.\n\n",
            CLI_NAME);
    fprintf(out, "  %-20s %s\n", "--world N", "ranks (default tp x pp: dp = 1); dp = world / (tp x pp)");
    fprintf(out, "  %-20s %s\n", "--json", "print one JSON object (bytes per rank, every term)");
    fprintf(out, "  %-20s %s\n", "--svg FILE", "also draw a stacked bar per stage (paper | this implementation)");
    fprintf(out, "  %-20s %s\n", "--help", "show this help");
    fprintf(out, "\npretrain_gpt's flags (all accepted; these shape the estimate):\n");
    usage_flags(out);
    fprintf(out, "\nexample (GPT-2 350M at TP2 x PP2, SP, selective recompute):\n"
                 "  %s memory --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \\\n"
                 "      --seq-length 1024 --vocab-size 50257 --micro-batch-size 4 --global-batch-size 32 \\\n"
                 "      --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \\\n"
                 "      --sequence-parallel --recompute-granularity selective --bf16\n",
            CLI_NAME);
}

/* Takes --world, --json, --svg (also as --name=value) out of argv; the rest goes to
   pretrain_gpt's parser. Returns ARGS_OK, ARGS_HELP, ARGS_ERROR or ARGS_UNKNOWN. */
static int memory_parse(int argc, char **argv, memory_args *a) {
    char **rest = malloc(sizeof *rest * (size_t)(argc + 1));
    int n_rest = 0, rc = ARGS_OK;
    if (!rest) return ARGS_ERROR;
    memset(a, 0, sizeof *a);
    rest[n_rest++] = argv[0];
    for (int i = 1; i < argc && rc == ARGS_OK; ++i) {
        const char *arg = argv[i];
        size_t len = strcspn(arg, "=");
        const char *value = arg[len] == '=' ? arg + len + 1 : NULL;
        int is_world = strncmp(arg, "--world", len) == 0 && len == 7;
        int is_svg = strncmp(arg, "--svg", len) == 0 && len == 5;
        if (strcmp(arg, "--json") == 0) {
            a->json = 1;
        } else if (is_world || is_svg) {
            if (!value) value = i + 1 < argc ? argv[++i] : NULL;
            if (!value) {
                fprintf(stderr, "%s: %.*s needs 1 value(s)\n", args_prog, (int)len, arg);
                rc = ARGS_ERROR;
            } else if (is_svg) {
                a->svg_path = value;
            } else if (parse_int("--world", value, &a->world) != 0) {
                rc = ARGS_ERROR;
            } else if (a->world < 1) {
                fprintf(stderr, "%s: --world must be >= 1, got %d\n", args_prog, a->world);
                rc = ARGS_ERROR;
            }
        } else {
            rest[n_rest++] = argv[i];
        }
    }
    if (rc == ARGS_OK) rc = parse_args(n_rest, rest, &a->gpt);
    free(rest);
    return rc;
}

/* --- text ------------------------------------------------------------------------------------ */

/* Columns of UTF-8 text (one per character, not per byte). */
static int utf8_width(const char *s) {
    int w = 0;
    for (; *s; ++s) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

static void print_padded(const char *s, int width) {
    fputs(s, stdout);
    for (int w = utf8_width(s); w < width; ++w) fputc(' ', stdout);
}

static const char *memory_recompute_name(const mc_gpt_config *c) {
    if (c->recompute_granularity == MC_RECOMPUTE_SELECTIVE) return "selective";
    if (c->recompute_granularity != MC_RECOMPUTE_FULL) return "none";
    return c->recompute_method == MC_RECOMPUTE_BLOCK ? "full, block" : "full, uniform";
}

static void memory_print_header(const mc_memory_desc *d, const mc_grid *g, const char *schedule) {
    const mc_gpt_config *c = &d->config;
    printf("megatron_c memory: GPT, %d layers, hidden %d, %d heads, ffn %d, seq %d, vocab %d "
           "(padded %d), max positions %d, micro-batch %d%s\n",
           c->num_layers, c->hidden_size, c->num_attention_heads, c->ffn_hidden_size,
           c->seq_length, c->vocab_size, c->padded_vocab_size, c->max_position_embeddings,
           c->micro_batch_size, c->untie_embeddings_and_output_weights ? ", untied output" : "");
    char recompute[64];
    snprintf(recompute, sizeof recompute, "%s", memory_recompute_name(c));
    if (c->recompute_granularity == MC_RECOMPUTE_FULL)
        snprintf(recompute, sizeof recompute, "%s, n = %d layers", memory_recompute_name(c),
                 c->recompute_num_layers);
    printf("layout: world %d = tp %d x pp %d x dp %d%s; %s, M = %d micro-batches per DP rank; "
           "recompute %s; distributed optimizer %s\n",
           g->desc.world, g->desc.tp, g->desc.pp, g->dp,
           c->virtual_pipeline_model_parallel_size > 1 ? " x vpp chunks" : "", schedule,
           d->num_microbatches, recompute, d->distributed_optimizer ? "on" : "off");
    printf("precision (--bf16 %s): %s, in both models\n", d->bf16 ? "on" : "off",
           d->bf16 ? "bf16 params and activations, fp32 grads and main params" : "fp32");
    printf("symbols: s %d, b %d, h %d, a %d, F %d, L %d, V %d, Pm %d, t %d, p %d, v %d, d %d, "
           "M %d%s\n\n",
           c->seq_length, c->micro_batch_size, c->hidden_size, c->num_attention_heads,
           c->ffn_hidden_size, c->num_layers, c->padded_vocab_size, c->max_position_embeddings,
           g->desc.tp, g->desc.pp,
           c->virtual_pipeline_model_parallel_size > 1 ? c->virtual_pipeline_model_parallel_size : 1,
           g->dp, d->num_microbatches, c->sequence_parallel ? ", sequence parallel" : "");
}

static void memory_print_model(const mc_memory_stage *st, mc_memory_model model) {
    char bytes[32];
    int last_cat = -1;
    printf("  %s\n", model == MC_MEMORY_PAPER
                         ? "paper (Megatron-LM; Korthikanti et al. 2022)"
                         : "this implementation (what pretrain_gpt allocates)");
    for (int i = 0; i < st->n_terms; ++i) {
        const mc_memory_term *t = &st->terms[i];
        if ((int)t->model != (int)model) continue;
        printf("    %-14s ", (int)t->category != last_cat ? mc_memory_category_name(t->category) : "");
        last_cat = (int)t->category;
        print_padded(t->name, 30);
        fputc(' ', stdout);
        print_padded(t->formula, 62);
        printf(" %11s\n", mc_memory_format_bytes(bytes, sizeof bytes, t->bytes));
        printf("    %-14s %-30s = %s\n", "", "", t->values);
    }
    printf("    %-14s %-30s %-62s %11s\n", "total", "", "",
           mc_memory_format_bytes(bytes, sizeof bytes, st->total[model]));
}

static void memory_print_stage(const mc_memory_stage *st, const mc_grid *g) {
    char first[16];
    snprintf(first, sizeof first, "%d", st->pp_rank * st->layers / st->chunks);
    printf("stage %d of %d (pp rank %d): %d layers%s%s%s; each of its %d ranks (tp %d x dp %d) "
           "holds\n",
           st->pp_rank, st->pp, st->pp_rank, st->layers,
           st->chunks > 1 ? " in chunks" : "", st->embedding ? ", the embedding" : "",
           st->output_layer ? ", the final norm, output layer and loss" : "", st->ranks,
           g->desc.tp, g->dp);
    printf("  P  = %s\n     = %s\n     = %.0f parameters", st->params_formula, st->params_values,
           st->params);
    if (st->params_padded != st->params)
        printf("; P' = %.0f with the distributed optimizer's padding", st->params_padded);
    printf("\n  in flight (paper): %s\n                     = %s\n", st->in_flight_formula,
           st->in_flight_values);
    printf("  this implementation: %d activation slot(s) per chunk, %d P2P receive buffer(s) at "
           "the peak\n", st->n_slots, st->p2p_buffers);
    memory_print_model(st, MC_MEMORY_PAPER);
    memory_print_model(st, MC_MEMORY_IMPLEMENTATION);
    printf("\n");
    (void)first;
}

static void memory_print_summary_row(const mc_memory_stage *st, mc_memory_model model) {
    char b[32];
    if (model == MC_MEMORY_PAPER) printf("stage %-3d paper              ", st->pp_rank);
    else printf("          this implementation");
    for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; ++c)
        printf(" %13s", mc_memory_format_bytes(b, sizeof b, st->bytes[model][c]));
    printf(" %11s\n", mc_memory_format_bytes(b, sizeof b, st->total[model]));
}

/* --- JSON ------------------------------------------------------------------------------------ */

static void json_write_bytes_object(FILE *out, const mc_memory_stage *st, mc_memory_model m) {
    fputc('{', out);
    for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; ++c)
        fprintf(out, "\"%s\": %.0f, ", mc_memory_category_name(c), st->bytes[m][c]);
    fprintf(out, "\"total\": %.0f}", st->total[m]);
}

static void json_write_key_string(FILE *out, const char *key, const char *value, int comma) {
    fprintf(out, "\"%s\": ", key);
    json_write_string(out, value);
    if (comma) fputs(", ", out);
}

static void memory_write_json_stage(FILE *out, const mc_memory_stage *st, int comma) {
    fprintf(out, "    {\"pp_rank\": %d, \"ranks\": %d, \"layers\": %d, \"chunks\": %d, "
                 "\"embedding\": %s, \"output_layer\": %s,\n     \"params\": %.0f, "
                 "\"params_padded\": %.0f, ",
            st->pp_rank, st->ranks, st->layers, st->chunks, st->embedding ? "true" : "false",
            st->output_layer ? "true" : "false", st->params, st->params_padded);
    json_write_key_string(out, "params_formula", st->params_formula, 1);
    json_write_key_string(out, "params_values", st->params_values, 0);
    fprintf(out, ",\n     \"in_flight\": %d, ", st->in_flight);
    json_write_key_string(out, "in_flight_formula", st->in_flight_formula, 1);
    json_write_key_string(out, "in_flight_values", st->in_flight_values, 0);
    fprintf(out, ", \"n_slots\": %d, \"p2p_buffers\": %d,\n     \"paper\": ", st->n_slots,
            st->p2p_buffers);
    json_write_bytes_object(out, st, MC_MEMORY_PAPER);
    fputs(",\n     \"implementation\": ", out);
    json_write_bytes_object(out, st, MC_MEMORY_IMPLEMENTATION);
    fputs(",\n     \"terms\": [", out);
    for (int i = 0; i < st->n_terms; ++i) {
        const mc_memory_term *t = &st->terms[i];
        fputs(i ? ",\n       {" : "\n       {", out);
        json_write_key_string(out, "model", mc_memory_model_name(t->model), 1);
        json_write_key_string(out, "category", mc_memory_category_name(t->category), 1);
        json_write_key_string(out, "name", t->name, 1);
        json_write_key_string(out, "formula", t->formula, 1);
        json_write_key_string(out, "values", t->values, 1);
        fprintf(out, "\"bytes\": %.0f}", t->bytes);
    }
    fprintf(out, "]}%s\n", comma ? "," : "");
}

/* --- SVG: a stacked bar per stage and model -------------------------------------------------- */

enum { MSVG_LEFT = 96, MSVG_TOP = 86, MSVG_PLOT = 320, MSVG_BAR = 30, MSVG_PAIR_GAP = 6,
       MSVG_STAGE_GAP = 34 };

static const char *const memory_svg_colours[MC_MEMORY_CATEGORY_COUNT] = {
    "#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#9c755f"};

/* A tick step of 1, 2 or 5 times a power of 1024-based unit, about max / 5. */
static double memory_svg_tick(double max) {
    double unit = 1.0, raw = max / 5.0;
    while (unit * 1024.0 <= raw) unit *= 1024.0;
    static const double steps[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1024};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; ++i)
        if (unit * steps[i] >= raw) return unit * steps[i];
    return unit * 1024.0;
}

static int memory_write_svg(const char *path, const mc_memory_stage *shown, int n_shown,
                            const mc_memory_desc *d, const mc_grid *g) {
    FILE *out = fopen(path, "w");
    if (!out) {
        fprintf(stderr, "%s memory: cannot write --svg %s: %s\n", CLI_NAME, path, strerror(errno));
        return MC_ERR_IO;
    }
    double max = 1.0;
    for (int i = 0; i < n_shown; ++i)
        for (int m = 0; m < MC_MEMORY_MODEL_COUNT; ++m)
            if (shown[i].total[m] > max) max = shown[i].total[m];
    double tick = memory_svg_tick(max), top = ceil(max / tick) * tick, scale = MSVG_PLOT / top;
    int stage_w = 2 * MSVG_BAR + MSVG_PAIR_GAP + MSVG_STAGE_GAP;
    int width = MSVG_LEFT + n_shown * stage_w + 200, height = MSVG_TOP + MSVG_PLOT + 70;
    if (width < 960) width = 960;   /* room for the title lines */
    int base = MSVG_TOP + MSVG_PLOT, legend_x = MSVG_LEFT + n_shown * stage_w + 16;
    const mc_gpt_config *c = &d->config;
    char label[48];
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                 "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
            width, height, width, height);
    fputs("<style>text{fill:#222222}.title{font-size:16px;font-weight:bold}"
          ".sub{font-size:12px;fill:#444444}.tick{font-size:10px;fill:#555555;text-anchor:end}"
          ".lab{font-size:11px;text-anchor:middle}.small{font-size:9px;text-anchor:middle;"
          "fill:#555555}.bar{stroke:#ffffff;stroke-width:0.5}</style>\n", out);
    fputs("<rect class=\"background\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n", out);
    fprintf(out, "<text x=\"%d\" y=\"24\" class=\"title\">memory per rank: %d layers, hidden %d, "
                 "seq %d, micro-batch %d, M = %d</text>\n",
            MSVG_LEFT, c->num_layers, c->hidden_size, c->seq_length, c->micro_batch_size,
            d->num_microbatches);
    fprintf(out, "<text x=\"%d\" y=\"44\" class=\"sub\">world %d = tp %d x pp %d x dp %d%s%s, "
                 "recompute %s, distributed optimizer %s; %s</text>\n",
            MSVG_LEFT, g->desc.world, g->desc.tp, g->desc.pp, g->dp,
            c->virtual_pipeline_model_parallel_size > 1 ? " (interleaved)" : "",
            c->sequence_parallel ? ", sequence parallel" : "", memory_recompute_name(c),
            d->distributed_optimizer ? "on" : "off", d->bf16 ? "bf16" : "fp32");
    fprintf(out, "<text x=\"%d\" y=\"62\" class=\"sub\">left bar: paper (Megatron-LM, "
                 "Korthikanti et al. 2022); right bar: this implementation</text>\n", MSVG_LEFT);
    for (double y = 0.0; y <= top + tick / 2; y += tick) {   /* the axis */
        double py = base - y * scale;
        fprintf(out, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n",
                MSVG_LEFT - 4, py, MSVG_LEFT + n_shown * stage_w, py);
        fprintf(out, "<text x=\"%d\" y=\"%.1f\" class=\"tick\">%s</text>\n", MSVG_LEFT - 8,
                py + 3, mc_memory_format_bytes(label, sizeof label, y));
    }
    for (int i = 0; i < n_shown; ++i) {
        int x0 = MSVG_LEFT + 12 + i * stage_w;
        for (int m = 0; m < MC_MEMORY_MODEL_COUNT; ++m) {
            int x = x0 + m * (MSVG_BAR + MSVG_PAIR_GAP);
            double y = base;
            for (int k = 0; k < MC_MEMORY_CATEGORY_COUNT; ++k) {
                double h = shown[i].bytes[m][k] * scale;
                if (shown[i].bytes[m][k] <= 0.0) continue;
                y -= h;
                fprintf(out, "<rect class=\"bar\" x=\"%d\" y=\"%.2f\" width=\"%d\" height=\"%.2f\" "
                             "fill=\"%s\"><title>stage %d, %s: %s %s</title></rect>\n",
                        x, y, MSVG_BAR, h, memory_svg_colours[k], shown[i].pp_rank,
                        m == MC_MEMORY_PAPER ? "paper" : "this implementation",
                        mc_memory_category_name(k),
                        mc_memory_format_bytes(label, sizeof label, shown[i].bytes[m][k]));
            }
            fprintf(out, "<text x=\"%d\" y=\"%.1f\" class=\"small\">%s</text>\n", x + MSVG_BAR / 2,
                    y - 4, mc_memory_format_bytes(label, sizeof label, shown[i].total[m]));
            fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"small\">%s</text>\n", x + MSVG_BAR / 2,
                    base + 12, m == MC_MEMORY_PAPER ? "paper" : "impl.");
        }
        fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"lab\">stage %d</text>\n",
                x0 + MSVG_BAR + MSVG_PAIR_GAP / 2, base + 28, shown[i].pp_rank);
    }
    for (int k = 0; k < MC_MEMORY_CATEGORY_COUNT; ++k) {
        int y = MSVG_TOP + 10 + k * 20;
        fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                     "<text x=\"%d\" y=\"%d\" class=\"sub\">%s</text>\n",
                legend_x, y, memory_svg_colours[k], legend_x + 18, y + 10,
                mc_memory_category_name(k));
    }
    fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"sub\">bytes per rank</text>\n", MSVG_LEFT,
            base + 52);
    fputs("</svg>\n", out);
    if (fclose(out) != 0) {
        fprintf(stderr, "%s memory: writing --svg %s failed: %s\n", CLI_NAME, path, strerror(errno));
        return MC_ERR_IO;
    }
    return MC_OK;
}

/* --- the subcommand -------------------------------------------------------------------------- */

/* Which stages get the full report: all of them up to MEM_MAX_SHOWN, else the first three, the
   middle one, the last three and the largest. */
static int memory_pick_stages(int pp, int largest, int *pick) {
    int n = 0;
    if (pp <= MEM_MAX_SHOWN) {
        for (int r = 0; r < pp; ++r) pick[n++] = r;
        return n;
    }
    int cand[8] = {0, 1, 2, pp / 2, largest, pp - 3, pp - 2, pp - 1};
    for (int i = 0; i < 8; ++i) {
        int dup = 0;
        for (int j = 0; j < n; ++j) dup |= pick[j] == cand[i];
        if (!dup) pick[n++] = cand[i];
    }
    for (int i = 1; i < n; ++i)   /* ascending */
        for (int j = i; j > 0 && pick[j - 1] > pick[j]; --j) {
            int tmp = pick[j];
            pick[j] = pick[j - 1];
            pick[j - 1] = tmp;
        }
    return n;
}

static int cmd_memory(int argc, char **argv) {
    memory_args a;
    args_prog = CLI_NAME " memory";
    int parsed = memory_parse(argc, argv, &a);
    if (parsed == ARGS_HELP) {
        usage_memory(stdout);
        return CLI_EXIT_OK;
    }
    if (parsed == ARGS_UNKNOWN) usage_memory(stderr);
    if (parsed != ARGS_OK) return CLI_EXIT_USAGE;
    const args *ga = &a.gpt;
    /* the checks pretrain_gpt makes, in its order: the grid, the config, the batch */
    mc_grid grid;
    mc_grid_desc gd = {.world = a.world ? a.world : ga->tp * ga->pp, .tp = ga->tp, .pp = ga->pp,
                       .vpp = ga->vpp > 1 ? ga->vpp : 0};
    int rc = mc_grid_init(&grid, &gd);
    if (rc != MC_OK) {
        fprintf(stderr, "%s: %s: %s\n", args_prog, mc_err_name(rc), mc_last_error());
        return CLI_EXIT_USAGE;
    }
    if (args_check_config(ga, stderr) > 0) return CLI_EXIT_USAGE;
    mc_microbatch_calc mb;
    if (args_microbatches(ga, grid.dp, &mb, stderr) != MC_OK) return CLI_EXIT_USAGE;
    mc_memory_desc d = args_memory_desc(ga, grid.dp);
    mc_gpt_config_resolve(&d.config, &d.config);
    /* pass 1: every stage's totals (the job's sum, the largest stage) */
    static mc_memory_stage st;
    double job[MC_MEMORY_MODEL_COUNT] = {0, 0};
    int largest = 0, pp = grid.desc.pp;
    double largest_total = -1.0;
    for (int r = 0; r < pp; ++r) {
        if ((rc = mc_memory_estimate(&d, r, &st)) != MC_OK) {
            fprintf(stderr, "%s: %s\n", args_prog, mc_last_error());
            return CLI_EXIT_USAGE;
        }
        for (int m = 0; m < MC_MEMORY_MODEL_COUNT; ++m) job[m] += st.total[m] * st.ranks;
        if (st.total[MC_MEMORY_IMPLEMENTATION] > largest_total)
            largest_total = st.total[MC_MEMORY_IMPLEMENTATION], largest = r;
    }
    /* pass 2: the stages shown */
    int pick[MEM_MAX_SHOWN];
    int n_shown = memory_pick_stages(pp, largest, pick);
    mc_memory_stage *shown = malloc(sizeof *shown * (size_t)n_shown);
    if (!shown) {
        fprintf(stderr, "%s: out of memory\n", args_prog);
        return CLI_EXIT_FAILURE;
    }
    for (int i = 0; i < n_shown; ++i) mc_memory_estimate(&d, pick[i], &shown[i]);
    mc_schedule_desc sd = {.pp = pp, .num_microbatches = d.num_microbatches,
                           .vpp = grid.desc.vpp};
    const char *schedule = mc_schedule_name(&sd);
    const char *schedule_text = pp == 1 ? "no pipelining"
                                : grid.desc.vpp > 1 ? "interleaved 1F1B" : "1F1B";
    char b0[32], b1[32], b2[32];
    if (a.json) {
        const mc_gpt_config *c = &d.config;
        printf("{\"model\": {\"num_layers\": %d, \"hidden_size\": %d, \"num_attention_heads\": %d, "
               "\"ffn_hidden_size\": %d, \"seq_length\": %d, \"vocab_size\": %d, "
               "\"padded_vocab_size\": %d, \"max_position_embeddings\": %d, "
               "\"micro_batch_size\": %d, \"untie_embeddings_and_output_weights\": %s},\n",
               c->num_layers, c->hidden_size, c->num_attention_heads, c->ffn_hidden_size,
               c->seq_length, c->vocab_size, c->padded_vocab_size, c->max_position_embeddings,
               c->micro_batch_size, c->untie_embeddings_and_output_weights ? "true" : "false");
        printf(" \"layout\": {\"world\": %d, \"tp\": %d, \"pp\": %d, \"vpp\": %d, \"dp\": %d, "
               "\"sequence_parallel\": %s, \"recompute\": \"%s\", \"recompute_num_layers\": %d, "
               "\"num_microbatches\": %d, \"schedule\": \"%s\", \"distributed_optimizer\": %s, "
               "\"bf16\": %s},\n",
               grid.desc.world, grid.desc.tp, pp, grid.desc.vpp > 1 ? grid.desc.vpp : 1, grid.dp,
               c->sequence_parallel ? "true" : "false", memory_recompute_name(c),
               c->recompute_num_layers, d.num_microbatches, schedule,
               d.distributed_optimizer ? "true" : "false", d.bf16 ? "true" : "false");
        printf(" \"stages_shown\": %d, \"stages\": [\n", n_shown);
        for (int i = 0; i < n_shown; ++i) memory_write_json_stage(stdout, &shown[i], i + 1 < n_shown);
        printf(" ],\n \"job\": {\"ranks\": %d, \"paper\": %.0f, \"implementation\": %.0f}}\n",
               grid.desc.world, job[0], job[1]);
    } else {
        memory_print_header(&d, &grid, schedule_text);
        for (int i = 0; i < n_shown; ++i) memory_print_stage(&shown[i], &grid);
        if (n_shown < pp)
            printf("(%d of %d stages shown: the first, middle, last and largest ones)\n\n",
                   n_shown, pp);
        printf("per rank                     ");
        for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; ++c)
            printf(" %13s", mc_memory_category_name(c));
        printf(" %11s\n", "total");
        for (int i = 0; i < n_shown; ++i) {
            memory_print_summary_row(&shown[i], MC_MEMORY_PAPER);
            memory_print_summary_row(&shown[i], MC_MEMORY_IMPLEMENTATION);
        }
        printf("job (%d ranks): paper %s, this implementation %s; the largest rank (this "
               "implementation) is on stage %d: %s\n",
               grid.desc.world, mc_memory_format_bytes(b0, sizeof b0, job[0]),
               mc_memory_format_bytes(b1, sizeof b1, job[1]), largest,
               mc_memory_format_bytes(b2, sizeof b2, largest_total));
        printf("notes: a category is its peak and a total their sum. The paper's 34 and 5 count "
               "2-byte activations and\n1-byte dropout masks (%s). This implementation keeps, per "
               "chunk, slots for the most micro-batches\nthe schedule holds at once, its own "
               "caches, and receive buffers for the tensors in flight;\npretrain_gpt refuses to "
               "start when the ranks of a host would need more than its memory.\n",
               d.bf16 ? "--bf16" : "without --bf16 the same tensors in fp32 give 66 and 9");
    }
    int exit_code = CLI_EXIT_OK;
    if (a.svg_path) {
        if (memory_write_svg(a.svg_path, shown, n_shown, &d, &grid) != MC_OK)
            exit_code = CLI_EXIT_FAILURE;
        else
            fprintf(stderr, "%s: wrote %s (%d stage(s), paper | this implementation)\n",
                    args_prog, a.svg_path, n_shown);
    }
    free(shown);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s: writing to stdout failed\n", args_prog);
        exit_code = CLI_EXIT_FAILURE;
    }
    return exit_code;
}

/* ---------------------------------------------------------------------------------------------
   The subcommand table and main. */

static int cmd_help(int argc, char **argv);
static void usage_help(FILE *out);

typedef struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);   /* argv[0] is the subcommand's name */
    void (*usage)(FILE *out);
} cli_command;

static const cli_command cli_commands[] = {
    {"layout", "rank coordinates and every parallel group (Megatron's RankGenerator)",
     cmd_layout, usage_layout},
    {"schedule", "op order of every pipeline stage (1F1B, interleaved) and its bubble",
     cmd_schedule, usage_schedule},
    {"microbatches", "micro-batch calculator: consumed samples -> global batch, M",
     cmd_microbatches, usage_microbatches},
    {"memory", "bytes per rank and stage, formula by formula (paper | this implementation)",
     cmd_memory, usage_memory},
    {"help", "show the help of a command", cmd_help, usage_help},
};
#define CLI_N_COMMANDS ((int)(sizeof cli_commands / sizeof cli_commands[0]))

static const cli_command *cli_find_command(const char *name) {
    for (int i = 0; i < CLI_N_COMMANDS; ++i)
        if (strcmp(cli_commands[i].name, name) == 0) return &cli_commands[i];
    return NULL;
}

static void usage_main(FILE *out) {
    fprintf(out, "usage: %s <command> [options]     (%s <command> --help for its options)\n\n"
                 "Megatron-Core's parallel layout, computed by megatron_c %s.\n\ncommands:\n",
            CLI_NAME, CLI_NAME, mc_version_string());
    for (int i = 0; i < CLI_N_COMMANDS; ++i)
        fprintf(out, "  %-10s %s\n", cli_commands[i].name, cli_commands[i].summary);
    fprintf(out, "\nexit status: 0 ok, 1 output failed, 2 bad usage or invalid sizes\n");
}

static void usage_help(FILE *out) {
    fprintf(out, "usage: %s help [command]\n", CLI_NAME);
}

static int cmd_help(int argc, char **argv) {
    if (argc < 2) {
        usage_main(stdout);
        return CLI_EXIT_OK;
    }
    const cli_command *cmd = cli_find_command(argv[1]);
    if (!cmd) {
        fprintf(stderr, "%s help: unknown command '%s'\n\n", CLI_NAME, argv[1]);
        usage_main(stderr);
        return CLI_EXIT_USAGE;
    }
    cmd->usage(stdout);
    return CLI_EXIT_OK;
}

/* MEGATRON_C_CLI_NO_MAIN: tests/fuzz/fuzz_cli.c includes this file and calls the commands. */
#ifndef MEGATRON_C_CLI_NO_MAIN
int main(int argc, char **argv) {
    if (argc < 2) {
        usage_main(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        usage_main(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0) {
        printf("%s %s\n", CLI_NAME, mc_version_string());
        return CLI_EXIT_OK;
    }
    const cli_command *cmd = cli_find_command(name);
    if (!cmd) {
        fprintf(stderr, "%s: unknown command '%s'\n\n", CLI_NAME, name);
        usage_main(stderr);
        return CLI_EXIT_USAGE;
    }
    return cmd->run(argc - 1, argv + 1);
}
#endif
