/* labs/lab_driver.h - the lab driver: a lab is a lab_spec handed to lab_main.

   WRITING A LAB
   A lab is four files and no harness code:
       labs/labNN.c                  its experiments and its facts (a lab_spec, below)
       labs/rubric/labNN.json        the rubric: items, concepts, predictions, and "variants"
                                     ({"F1": {"title": ..., "question": ...}, ...})
       labs/templates/labNN.md       the answer sheet, with the placeholders {nonce},
                                     {probe_rank}, {variant} and {variant_question} (and
                                     {followup_probe_rank}, see lab_spec.followup_world)
       answers/reference/labNN.md    reference answers (and labNN.zh.md)
   `make labs` builds every labs/labNN.c; `make labNN && mpirun -np N ./labNN` runs one.

   What lab_main does for every lab, in this order:
     1. flags: lab_parse_args plus the spec's own `flags`; --help, --init (writes the sheet
        from the template with a fresh nonce, or --nonce's) and --grade-only need no mpirun;
     2. the world: mc_comm_init_world (--backend; collectives time out after
        --distributed-timeout-minutes, default 30 s or 3x --timeout), then the rank grid from
        --tp/--pp/--cp/--ep/--etp/--vpp/--order over the spec's default `sizes`. A world the
        lab cannot use (sizes that do not divide, fewer than min_world or more than max_world
        ranks, or the spec's check_world) gets one message on rank 0 that names the value and
        the rule, and exit status 2 on every rank;
     3. the answer sheet, before anything is measured: its header gives the nonce (a missing
        sheet is written from the template first; --nonce overrides), the nonce gives the
        probe rank and the follow-up variant; the pred blocks are hashed and locked in the
        ledger (results/labNN.ledger.json: the first measured run per nonce locks them);
     4. backend facts through mc_backend_query (no CUDA calls in labs);
     5. the experiments, in order, on every rank (they are collective), each one timed (the
        slowest rank's seconds go into the results);
     6. rank 0 writes results/labNN.json: the versioned envelope (format 2: lab, question,
        build (the git commit), config, backend, nonce, probe, predictions, ledger, run with
        per-experiment times and every check) around the object the spec's `facts` returns;
     7. grades answers/labNN.md against it and prints the score table (last line "Total x/15");
     8. exits 0 when every check held, 1 when one failed (or the results could not be written
        or graded), 2 for bad flags or a world the lab cannot use.

   An experiment prints its own heading (lab_heading), measures, keeps what it found in the
   lab's state (cx->state, spec.state_size zeroed bytes) and records what must hold with
   lab_check. It returns LAB_RAN or LAB_SKIPPED. MC_CHECK stops every rank on an unexpected
   library error. Print with lab_printf0 (rank 0 only).

   Example: a whole lab (the rubric, template and references are data files).

       #include "lab_driver.h"

       typedef struct demo_state { int sum; } demo_state;

       static int demo_sum(lab_ctx *cx) {
           demo_state *st = cx->state;
           lab_heading(cx, "A. all-reduce of the world ranks");
           MC_CHECK(lab_all_reduce_i32(cx->world, &cx->me, &st->sum, 1, MC_SUM));
           int want = cx->world_size * (cx->world_size - 1) / 2;
           lab_check(cx, st->sum == want, "the ranks sum to %d (got %d)", want, st->sum);
           lab_printf0("sum of the world ranks: %d\n", st->sum);
           return LAB_RAN;
       }

       static cJSON *demo_facts(lab_ctx *cx) {
           const demo_state *st = cx->state;
           cJSON *facts = cJSON_CreateObject();
           cJSON_AddNumberToObject(facts, "rank_sum", st->sum);
           return facts;
       }

       static const lab_experiment demo_experiments[] = {{"A", demo_sum}};

       static const lab_spec demo = {
           .name = "lab99", .question = "M099", .title = "the sum of the ranks",
           .default_world = 4, .sizes = {.tp = 2}, .n_variants = 1,
           .experiments = demo_experiments, .n_experiments = 1,
           .state_size = sizeof(demo_state), .facts = demo_facts,
       };

       int main(int argc, char **argv) { return lab_main(argc, argv, &demo); }

   `mpirun -np 4 ./lab99` then prints the run header, section A, "wrote results/lab99.json"
   and the score table; `mpirun -np 3 ./lab99` says "lab99 needs world % (tp*pp*cp) == 0:
   got 3 ranks for tp=2 pp=1; try mpirun -np 4" and exits 2. */
#ifndef MC_LAB_DRIVER_H_INCLUDED
#define MC_LAB_DRIVER_H_INCLUDED

#include "lab_common.h"
#include "lab_svg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What an experiment returns. */
#define LAB_RAN 0
#define LAB_SKIPPED 1   /* not run in this configuration (e.g. timing off): recorded as such */

typedef struct lab_ctx lab_ctx;

typedef struct lab_experiment {
    const char *name;             /* short id for the results' run.experiments: "A", "timing" */
    int (*run)(lab_ctx *cx);      /* LAB_RAN or LAB_SKIPPED; called on every rank */
} lab_experiment;

typedef struct lab_spec {
    const char *name;             /* "lab03": binary, answers/, results/, rubric, template */
    const char *question;         /* "M003" */
    const char *title;            /* "initialize_model_parallel" */
    const char *summary;          /* a paragraph for --help */
    const char *usage;            /* lines for --help about the lab's own flags, or NULL */
    const lab_flag *flags;        /* the lab's own flags (values: lab_flag_value) */
    int n_flags;
    /* the world */
    int default_world;            /* the card's -np N; probe ranks are drawn for it */
    mc_grid_desc sizes;           /* default tp, pp, cp, ep, etp, vpp, order (world ignored) */
    int min_world, max_world;     /* 0 = no bound */
    /* Further rules (optional): return 0 to accept, else write "needs ..." into why (the
       value and the rule) and return non-zero. Called on every rank with the grid ready. */
    int (*check_world)(const lab_ctx *cx, char *why, size_t why_cap);
    double call_timeout_s;        /* default of --timeout, the experiments' own watchdog */
    int n_variants;               /* follow-up variants F1..Fn drawn from the nonce */
    int followup_world;           /* a follow-up about a world of this size (0 = none): the
                                     nonce also draws a probe rank in it, shown by the
                                     template's {followup_probe_rank} (cx->followup_probe) */
    /* the run */
    const lab_experiment *experiments;
    int n_experiments;
    size_t state_size;            /* bytes of cx->state, zeroed by the driver */
    cJSON *(*facts)(lab_ctx *cx);       /* rank 0, after the experiments: results' "facts" */
    void (*report)(lab_ctx *cx);        /* optional, rank 0: printed before "wrote ..." */
    void (*cleanup)(lab_ctx *cx);       /* optional, every rank, after the results */
} lab_spec;

/* Everything an experiment reads. The driver fills it; labs treat it as read-only apart
   from `state`. */
struct lab_ctx {
    const lab_spec *spec;
    const lab_args *args;
    mc_comm *world;
    int me, world_size;
    mc_grid grid;                 /* the run's layout (spec sizes overridden by the flags) */
    /* from the answer sheet's nonce */
    char nonce[LAB_NONCE_LEN + 1];
    int probe_base;               /* probe rank in the default world (the sheet's header) */
    int probe;                    /* probe rank in this world: probe_base % world_size */
    int followup_probe;           /* probe rank in spec->followup_world (-1 without one);
                                     the same as probe_base modulo default_world whenever
                                     default_world divides followup_world */
    int variant;                  /* follow-up variant, 1 .. n_variants */
    char variant_name[8];         /* "F2" */
    /* environment */
    mc_backend_info backend;      /* this rank's (mc_backend_query) */
    double call_timeout_s;        /* --timeout, or the spec's call_timeout_s */
    void *state;                  /* the lab's own: spec->state_size bytes */
    struct lab__run *run;         /* the driver's bookkeeping */
};

/* The whole program: see the top of this file. Returns the exit status. */
int lab_main(int argc, char **argv, const lab_spec *spec);

/* "\n== <text> ==\n" on rank 0. */
void lab_heading(lab_ctx *cx, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Records a named check of the current experiment and returns ok. A failed check is printed
   ("check failed: ...") and makes the run exit 1 on every rank. Make checks on rank 0 or on
   values every rank holds: rank 0 prints them and writes its checks into the results. */
int lab_check(lab_ctx *cx, int ok, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The JSON that rank `root` built, on every rank (a probe rank's view for rank 0's facts).
   `mine` is consumed on every rank (other ranks may pass NULL); the caller owns the result. */
cJSON *lab_json_from_rank(lab_ctx *cx, cJSON *mine, int root);

/* The value of one of the spec's flags ("1" for a switch that was given), or NULL. */
const char *lab_flag_value(const lab_ctx *cx, const char *name);

/* Rank 0: writes the figure as results/<lab>.<name>.svg (beside the results) and lists it in
   the results' "figures". Returns 0 or a negative status; other ranks return 0. */
int lab_figure(lab_ctx *cx, const char *name, lab_svg *svg);

/* Heap the library allocated through mc_malloc on this rank, as the driver's allocator saw
   it: a lab measures what a call allocated or released by taking the stats around it, and
   the most a call ever held at once with lab_heap_peak_reset before it and peak_bytes after
   (e.g. the schedule's receive buffers while micro-batches are in flight). */
typedef struct lab_heap_stats {
    long long live_bytes;         /* usable bytes of the blocks alive now */
    long long live_blocks;
    long long allocs, frees;      /* calls so far */
    long long peak_bytes;         /* the highest live_bytes since the last lab_heap_peak_reset
                                     (or since the start) */
} lab_heap_stats;
void lab_heap_stats_get(lab_heap_stats *out);
/* Starts a new peak: peak_bytes becomes live_bytes. */
void lab_heap_peak_reset(void);
/* Calls fn for every block the library frees from now on (NULL stops it). */
void lab_heap_watch_frees(void (*fn)(void *ptr, void *user), void *user);

/* A barrier over the world whose waiting ranks sleep (a few ms between tests) instead of
   polling: while some ranks run alone (a single-rank reference, a sub-world), the others
   leave them the cores. Every rank calls it; a rank still waiting after `timeout_s` seconds
   (<= 0: 600) stops the run with a message. */
void lab_meet_idle(lab_ctx *cx, double timeout_s);

/* Rounding for results: seconds to 0.1 ms, milliseconds to 1 us (the rest is noise). */
double lab_round_s(double seconds);
double lab_round_ms(double ms);

#ifdef __cplusplus
}
#endif
#endif /* MC_LAB_DRIVER_H_INCLUDED */
