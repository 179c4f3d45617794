/* driver_lab - a small lab written on the lab driver, for tests/test_lab_driver.c.

       mpirun -np 4 build/tests/driver_lab --answers A --results R --rubric U --template T
                                          [--fail] [--no-figure] [--label TEXT] [--nonce HEX]

   "lab99" (M099): experiment A all-reduces the world ranks and checks the sum (--fail makes
   the check wrong on purpose); B draws a bar chart of the ranks (skipped with --no-figure);
   the probe rank reports its grid coordinates through lab_json_from_rank. Worlds: tp = 2 by
   default (an even world), at most 8 ranks, and not 6 (a rule of the lab's own, to test
   check_world). */
#include "labs/lab_driver.h"

#include <stdlib.h>
#include <string.h>

typedef struct demo_state {
    int sum, want;
    cJSON *probe;
    long long heap_of_group;
} demo_state;

static int demo_sum(lab_ctx *cx) {
    demo_state *st = cx->state;
    lab_heading(cx, "A. all-reduce of the world ranks");
    int mine = cx->me + (lab_flag_value(cx, "--fail") != NULL ? 1 : 0);
    MC_CHECK(lab_all_reduce_i32(cx->world, &mine, &st->sum, 1, MC_SUM));
    st->want = cx->world_size * (cx->world_size - 1) / 2;
    lab_check(cx, st->sum == st->want, "the ranks sum to %d (got %d)", st->want, st->sum);
    lab_printf0("sum of the world ranks: %d\n", st->sum);

    /* the heap a group creation takes, measured through the driver's allocator */
    int *all = lab_xcalloc((size_t)cx->world_size, sizeof *all);
    for (int i = 0; i < cx->world_size; i++) all[i] = i;
    lab_heap_stats before, after;
    lab_heap_stats_get(&before);
    mc_comm *copy = NULL;
    MC_CHECK(mc_comm_create_group(cx->world, all, cx->world_size, &copy));
    lab_heap_stats_get(&after);
    st->heap_of_group = after.live_bytes - before.live_bytes;
    mc_comm_destroy(copy);
    free(all);

    cJSON *mine_json = NULL;
    if (cx->me == cx->probe) {
        mc_rank_coords rc;
        MC_CHECK(mc_grid_coords(&cx->grid, cx->me, &rc));
        mine_json = cJSON_CreateObject();
        cJSON_AddNumberToObject(mine_json, "rank", cx->me);
        cJSON_AddNumberToObject(mine_json, "tp_rank", rc.tp);
        cJSON_AddNumberToObject(mine_json, "dp_rank", rc.dp);
    }
    st->probe = lab_json_from_rank(cx, mine_json, cx->probe);
    return LAB_RAN;
}

static int demo_figure(lab_ctx *cx) {
    if (lab_flag_value(cx, "--no-figure") != NULL) return LAB_SKIPPED;
    lab_heading(cx, "B. a bar per rank");
    lab_svg *svg = lab_svg_new(400, 200);
    lab_svg_axes ax = {.x = 50, .y = 20, .w = 330, .h = 140, .x_min = 0,
                       .x_max = cx->world_size, .y_min = 0, .y_max = cx->world_size,
                       .x_ticks = cx->world_size, .y_ticks = 2, .x_label = "rank",
                       .y_label = "rank + 1"};
    lab_svg_axes_draw(svg, &ax);
    for (int r = 0; r < cx->world_size; r++)
        lab_svg_rect(svg, lab_svg_x(&ax, r + 0.1), lab_svg_y(&ax, r + 1), lab_svg_dx(&ax, 0.8),
                     lab_svg_dy(&ax, r + 1), lab_svg_color(r), "a <bar> & its \"title\"");
    const char *label = lab_flag_value(cx, "--label");
    lab_svg_text(svg, 200, 14, LAB_SVG_MIDDLE, 12, label != NULL ? label : "ranks");
    MC_CHECK(lab_figure(cx, "bars", svg));
    lab_svg_free(svg);
    return LAB_RAN;
}

static int demo_check_world(const lab_ctx *cx, char *why, size_t cap) {
    if (cx->world_size != 6) return 0;
    snprintf(why, cap, "needs a world that is a power of two: got %d ranks", cx->world_size);
    return 1;
}

static cJSON *demo_facts(lab_ctx *cx) {
    const demo_state *st = cx->state;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "rank_sum", st->sum);
    cJSON_AddNumberToObject(f, "expected_sum", st->want);
    cJSON_AddNumberToObject(f, "group_heap_bytes", (double)st->heap_of_group);
    cJSON_AddItemToObject(f, "probe", st->probe != NULL ? cJSON_Duplicate(st->probe, 1)
                                                        : cJSON_CreateNull());
    return f;
}

static void demo_cleanup(lab_ctx *cx) {
    demo_state *st = cx->state;
    cJSON_Delete(st->probe);
}

static const lab_flag demo_flags[] = {{"--fail", 0}, {"--no-figure", 0}, {"--label", 1}};
static const lab_experiment demo_experiments[] = {{"A", demo_sum}, {"B", demo_figure}};

static const lab_spec demo_spec = {
    .name = "lab99",
    .question = "M099",
    .title = "the sum of the ranks",
    .summary = "lab99: a test lab on the driver.",
    .usage = "\nlab99: --fail breaks the check, --no-figure skips B, --label TEXT titles B.\n",
    .flags = demo_flags,
    .n_flags = 3,
    .default_world = 4,
    .sizes = {.tp = 2},
    .max_world = 8,
    .check_world = demo_check_world,
    .n_variants = 2,
    .experiments = demo_experiments,
    .n_experiments = 2,
    .state_size = sizeof(demo_state),
    .facts = demo_facts,
    .cleanup = demo_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &demo_spec); }
