/* test_timeline.c - the timeline (megatron_c.h >>core.timeline) in one process on the self
   backend: nothing recorded while no timeline is started; a blocking collective, an async one
   and its wait (ref, completion at the wait), spans and their nesting (parent, depth, spans
   left open closed with their parent), the ring (overwritten events gone, n_events counting
   all), completion markers on a copy of the CPU table (t_complete from the marker, pending
   until flush, every marker released, spans completing with their synchronous events but not
   with the async operations they started; a span closed on a device table completing after
   the host collectives inside it), the schedule's ops and its grad-sync mark, and the
   desc checks. */
#include <criterion/criterion.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"
#include "tests/sched_toy.h"

TestSuite(timeline, .timeout = 60);

static mc_comm *world;
static mc_timeline_event ring[256];
static mc_timeline tl;

static void setup(void) {
    cr_assert_eq(mc_comm_init_world(&world, &(mc_comm_desc){.backend = MC_BACKEND_SELF}), MC_OK,
                 "%s", mc_last_error());
}

static void teardown(void) {
    mc_timeline_stop(&tl);
    mc_comm_destroy(world);
}

static void start(int capacity) {
    cr_assert_eq(mc_timeline_start(&tl, &(mc_timeline_desc){.events = ring, .capacity = capacity}),
                 MC_OK, "%s", mc_last_error());
}

static const mc_timeline_event *at(long long id) {
    const mc_timeline_event *e = mc_timeline_event_at(&tl, id);
    cr_assert_not_null(e, "event %lld is not in the ring (n_events %lld)", id, tl.n_events);
    return e;
}

Test(timeline, desc_is_checked_and_names_the_field, .init = setup, .fini = teardown) {
    mc_timeline bad;
    cr_expect_eq(mc_timeline_start(&bad, &(mc_timeline_desc){.events = NULL, .capacity = 4}),
                 MC_ERR_INVALID_DESC);
    cr_expect(strstr(mc_last_error(), "events") != NULL, "%s", mc_last_error());
    cr_expect_eq(mc_timeline_start(&bad, &(mc_timeline_desc){.events = ring, .capacity = 0}),
                 MC_ERR_INVALID_DESC);
    cr_expect(strstr(mc_last_error(), "capacity (0)") != NULL, "%s", mc_last_error());
    cr_expect_eq(mc_timeline_start(&bad, NULL), MC_ERR_INVALID_ARG);
    cr_expect_str_eq(mc_timeline_kind_name(MC_TIMELINE_ASYNC), "async");
    cr_expect_str_eq(mc_timeline_kind_name(99), "?");
}

Test(timeline, nothing_is_recorded_without_a_timeline, .init = setup, .fini = teardown) {
    float x[4] = {1, 2, 3, 4};
    cr_expect_eq(mc_timeline_begin("app", 0), -1);
    mc_timeline_end(-1, NULL);
    mc_timeline_mark("m", 0);
    cr_assert_eq(mc_all_reduce(world, x, x, 4, MC_F32, MC_SUM), MC_OK);
    start(16);
    cr_expect_eq(tl.n_events, 0, "starting clears the ring");
    mc_timeline_stop(&tl);
    cr_assert_eq(mc_all_reduce(world, x, x, 4, MC_F32, MC_SUM), MC_OK);
    cr_expect_eq(tl.n_events, 0, "a stopped timeline records nothing");
    cr_expect_eq(tl.recording, 0);
}

Test(timeline, collectives_waits_and_spans, .init = setup, .fini = teardown) {
    float x[8] = {0};
    start(64);
    long long outer = mc_timeline_begin("outer", 7);
    cr_assert_eq(mc_all_reduce(world, x, x, 8, MC_F32, MC_SUM), MC_OK);
    mc_request *req = NULL;
    cr_assert_eq(mc_all_gather_async(world, x, x + 4, 4, MC_F32, &req), MC_OK);
    long long inner = mc_timeline_begin("inner", -1);
    mc_timeline_mark("instant", 3);
    mc_timeline_end(outer, NULL);   /* closes inner too */
    if (req) cr_assert_eq(mc_wait(req), MC_OK);
    cr_assert_eq(mc_timeline_stop(&tl), MC_OK);

    const mc_timeline_event *o = at(outer), *c = at(1), *a = at(2), *in = at(inner),
                            *m = at(4);
    cr_expect_eq(o->kind, MC_TIMELINE_SPAN);
    cr_expect_str_eq(o->name, "outer");
    cr_expect_eq(o->index, 7);
    cr_expect_eq(o->depth, 0);
    cr_expect_eq(o->parent, -1);
    cr_expect_eq(c->kind, MC_TIMELINE_COLLECTIVE);
    cr_expect_str_eq(c->name, "all_reduce");
    cr_expect_str_eq(c->comm, world->name);
    cr_expect_eq(c->bytes, 8 * sizeof(float));
    cr_expect_eq(c->parent, outer);
    cr_expect_eq(c->depth, 1);
    cr_expect(c->t_call <= c->t_return && c->t_complete == c->t_return,
              "a CPU collective has finished when it returns");
    cr_expect_eq(a->kind, MC_TIMELINE_ASYNC);
    cr_expect_str_eq(a->name, "all_gather");
    cr_expect_eq(in->parent, outer);
    cr_expect_eq(m->kind, MC_TIMELINE_MARK);
    cr_expect_eq(m->parent, inner);
    cr_expect_eq(m->depth, 2);
    cr_expect_gt(in->t_return, 0.0, "the span left open ended with its parent");
    cr_expect_leq(in->t_return, o->t_return);
    if (req) {
        const mc_timeline_event *w = at(5);
        cr_expect_eq(w->kind, MC_TIMELINE_WAIT);
        cr_expect_eq(w->ref, 2, "the wait names its async operation");
        cr_expect_eq(w->parent, -1);
        cr_expect_float_eq(a->t_complete, w->t_return, 1e-12, "completion seen at the wait");
        cr_expect_gt(a->t_complete, o->t_return, "the async op outlived its span");
        cr_expect_float_eq(o->t_complete, o->t_return, 1e-12,
                           "a span does not complete with the async ops it started");
    } else {
        cr_expect_gt(a->t_complete, 0.0, "done at launch: complete at once");
    }
    cr_expect_eq(tl.n_events, req ? 6 : 5);
}

Test(timeline, the_ring_keeps_the_last_events, .init = setup, .fini = teardown) {
    start(4);
    for (int i = 0; i < 10; i++) mc_timeline_mark("tick", i);
    cr_expect_eq(tl.n_events, 10);
    cr_expect_eq(mc_timeline_first(&tl), 6);
    cr_expect_null(mc_timeline_event_at(&tl, 5));
    cr_expect_null(mc_timeline_event_at(&tl, 10));
    cr_expect_eq(at(6)->index, 6);
    cr_expect_eq(at(9)->index, 9);
    cr_expect_eq(at(9)->id, 9);
}

/* A CPU table with completion markers: every marker "completes" 5 s after it was recorded. */
static int marks_live, marks_made;
static int fake_record(const mc_ops *o, void **mark) {
    (void)o;
    double *t = (double *)malloc(sizeof *t);
    if (!t) return MC_ERR_NO_MEMORY;
    *t = mc_timeline_now() + 5.0;
    *mark = t;
    marks_live++;
    marks_made++;
    return MC_OK;
}
static int fake_time(const mc_ops *o, void *mark, double *t) {
    (void)o;
    *t = *(double *)mark;
    return MC_OK;
}
static void fake_release(const mc_ops *o, void *mark) {
    (void)o;
    free(mark);
    marks_live--;
}

/* The CPU table with those markers, the counts reset: a pretend device. */
static mc_ops fake_device(void) {
    mc_ops dev = *mc_ops_cpu();
    dev.mark_record = fake_record;
    dev.mark_time = fake_time;
    dev.mark_release = fake_release;
    marks_live = marks_made = 0;
    return dev;
}

Test(timeline, markers_give_completion_times_at_flush, .init = setup, .fini = teardown) {
    mc_ops dev = fake_device();
    start(64);
    long long outer = mc_timeline_begin("outer", -1);
    long long kernel = mc_timeline_begin("kernel", -1);
    mc_timeline_end(kernel, &dev);
    mc_timeline_end(outer, NULL);
    cr_expect_eq(at(kernel)->t_complete, 0.0, "pending until the marker is waited for");
    cr_expect_eq(marks_live, 1);
    cr_assert_eq(mc_timeline_flush(&tl), MC_OK);
    const mc_timeline_event *k = at(kernel), *o = at(outer);
    cr_expect_gt(k->t_complete, k->t_return + 4.0, "the device finished after the host returned");
    cr_expect_float_eq(o->t_complete, k->t_complete, 1e-12,
                       "a span completes when the work inside it does");
    cr_expect_eq(marks_live, 0, "every marker released");

    /* overwritten events release their markers too */
    cr_assert_eq(mc_timeline_start(&tl, &(mc_timeline_desc){.events = ring, .capacity = 2}),
                 MC_OK);
    for (int i = 0; i < 5; i++) mc_timeline_end(mc_timeline_begin("k", i), &dev);
    cr_expect_eq(marks_live, 2, "only the ring's two events hold markers");
    cr_assert_eq(mc_timeline_stop(&tl), MC_OK);
    cr_expect_eq(marks_live, 0);
    cr_expect_eq(marks_made, 6);
}

/* The optimizer's param all-gather span on a device table: its collectives complete when the
   host has them back (an mpi or self world, no marker), the span when the device has also run
   the work queued before it closed, which may be after the host calls the next forward; lab08
   times the gather by its collectives for that reason. */
Test(timeline, a_span_on_a_device_table_completes_after_its_host_collectives,
     .init = setup, .fini = teardown) {
    mc_ops dev = fake_device();
    float x[4] = {1, 2, 3, 4};
    start(64);
    long long gather = mc_timeline_begin("param_all_gather", -1);
    cr_assert_eq(mc_all_reduce(world, x, x, 4, MC_F32, MC_SUM), MC_OK);
    long long coll = tl.n_events - 1;
    mc_timeline_end(gather, &dev);
    long long next = mc_timeline_begin("forward", 0);
    mc_timeline_end(next, NULL);
    cr_assert_eq(mc_timeline_flush(&tl), MC_OK);
    const mc_timeline_event *g = at(gather), *c = at(coll), *f = at(next);
    cr_expect_eq(c->kind, MC_TIMELINE_COLLECTIVE);
    cr_expect_eq(c->parent, gather);
    cr_expect_leq(c->t_complete, f->t_call, "the collective completed before the next call");
    cr_expect_gt(g->t_complete, f->t_call + 4.0,
                 "the span's marker covers the device's queue: it completes after the next call");
    cr_expect_eq(marks_live, 0);
}

static mc_schedule_result result;

Test(timeline, schedule_ops_and_the_grad_sync_mark, .init = setup, .fini = teardown) {
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    cr_assert_eq(mc_parallel_init(&ps, &(mc_parallel_desc){.world = world}), MC_OK);
    toy t;
    cr_assert_eq(toy_init(&t, 1, 0, 1, 3), 0);
    mc_schedule_hooks hooks = toy_hooks(&t, 0);
    start(64);
    cr_assert_eq(mc_forward_backward_no_pipelining(&ps, &hooks, 3, 0, &result), MC_OK, "%s",
                 mc_last_error());
    cr_assert_eq(mc_timeline_stop(&tl), MC_OK);
    char got[128] = "";
    for (long long id = 0; id < tl.n_events; id++) {
        const mc_timeline_event *e = at(id);
        char one[24];
        if (e->kind == MC_TIMELINE_COMPUTE)
            snprintf(one, sizeof one, "%c%d ", e->name[0] == 'f' ? 'F' : 'B', e->index);
        else if (e->kind == MC_TIMELINE_MARK)
            snprintf(one, sizeof one, "S%d ", e->index);
        else
            continue;
        strncat(got, one, sizeof got - strlen(got) - 1);
        if (e->kind == MC_TIMELINE_COMPUTE) {
            cr_expect_eq(e->depth, 0);
            cr_expect(e->t_call <= e->t_return && e->t_complete == e->t_return);
        }
    }
    cr_expect_str_eq(got, "F0 B0 F1 B1 F2 S0 B2 ", "the op order and grad sync before the last");
    toy_free(&t);
    mc_parallel_destroy(&ps);
}
