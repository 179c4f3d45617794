/* labs/lab_common.h - the harness every lab shares (executables only, never megatron_c.h).

   What a lab gets from here:
     - check macros that stop the program with a readable report: MC_CHECK (megatron_c
       status), MPI_CHECK, and CUDA_CHECK / NCCL_CHECK when built with MC_ENABLE_CUDA;
     - one command-line parser for the flags every lab understands (lab_parse_args);
     - rank-0 printing (lab_printf0) and backend-neutral host-buffer collectives, so lab code
       works the same on MPI host buffers and NCCL device buffers;
     - the per-learner nonce: generation and the documented derivation of the probe rank and
       the follow-up variant;
     - the results writer (cJSON, written atomically).
   The run itself (world, answer sheet, experiments, results envelope, grading, exit status)
   is the driver's: see lab_driver.h.

   The check macros exit the process: that is the executable's decision to make. The library
   itself only returns statuses (see megatron_c.h, "megatron_c DOES NOT"). */
#ifndef MC_LAB_COMMON_H_INCLUDED
#define MC_LAB_COMMON_H_INCLUDED

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "megatron_c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes shared by the labs. */
#define LAB_EXIT_OK 0
#define LAB_EXIT_FAILED 1      /* the experiment ran but something did not hold */
#define LAB_EXIT_USAGE 2       /* bad flags, or the ranks cannot hold the requested sizes */

/* ---------------------------------------------------------------------------------------------
   >>check  llm.c-style check macros: `MC_CHECK(expr)` expands to a call that knows the file
   and line. On failure they print the expression, the status name, its meaning, the library's
   detailed message and a "---> HINT:" line for common setup mistakes, then abort every rank
   (MPI_Abort when MPI is running, exit(1) otherwise). */

#define MC_CHECK(expr) lab_mc_check((expr), #expr, __FILE__, __LINE__)
#define MPI_CHECK(expr) lab_mpi_check((expr), #expr, __FILE__, __LINE__)
void lab_mc_check(int status, const char *expr, const char *file, int line);
void lab_mpi_check(int mpi_status, const char *expr, const char *file, int line);

#if defined(MC_ENABLE_CUDA)
#define CUDA_CHECK(expr) lab_cuda_check((int)(expr), #expr, __FILE__, __LINE__)
#define NCCL_CHECK(expr) lab_nccl_check((int)(expr), #expr, __FILE__, __LINE__)
void lab_cuda_check(int cuda_status, const char *expr, const char *file, int line);
void lab_nccl_check(int nccl_status, const char *expr, const char *file, int line);
#endif

/* Stops every rank: MPI_Abort when MPI is initialised and not finalised, else exit(code). */
void lab_abort(int code);

/* ---------------------------------------------------------------------------------------------
   >>build  The git commit these binaries were built from (the Makefile embeds it at build
   time): 40 hex digits, or "unknown" outside a git checkout (e.g. a release tarball). dirty:
   1 when tracked files differed from that commit at build time, 0 when not, -1 unknown. */
const char *lab_build_commit(void);
int lab_build_dirty(void);

/* ---------------------------------------------------------------------------------------------
   >>args  Flags every lab understands. Zero / NULL means "the lab's default". A lab adds its
   own flags as a table of lab_flag; their values land in lab_args.flag_values. */

#define LAB_MAX_FLAGS 16

typedef struct lab_flag {
    const char *name;           /* "--probe" */
    int takes_value;            /* 0: a switch (its value reads "1"), 1: "--probe MODULE" */
} lab_flag;

typedef struct lab_args {
    /* sizes (--tp --pp --cp --ep --etp --vpp) and the rank order (--order) */
    int tp, pp, cp, ep, etp, vpp;
    const char *order;
    /* files */
    const char *answers_path;   /* --answers FILE   (default answers/<lab>.md) */
    const char *results_path;   /* --results FILE   (default results/<lab>.json) */
    const char *rubric_path;    /* --rubric FILE    (default labs/rubric/<lab>.json) */
    const char *template_path;  /* --template FILE  (default labs/templates/<lab>.md) */
    const char *nonce;          /* --nonce HEX: use this nonce instead of the sheet's (tests) */
    /* modes */
    int init;                   /* --init: write the answer-sheet template and exit */
    int force;                  /* --force: --init may overwrite a filled sheet */
    int grade_only;             /* --grade-only: grade the last results, no experiment */
    int json;                   /* --json: also print the results document */
    int help;                   /* --help */
    int timing;                 /* --timing 1, --no-timing 0, unset -1 (lab decides) */
    int quick;                  /* --quick: the lab's shortest meaningful run */
    double timeout_s;           /* --timeout S: watchdog of the lab's own calls (0 = default) */
    double world_timeout_min;   /* --distributed-timeout-minutes M: every collective on the
                                   world and its groups (Megatron's flag; 0 = the driver's) */
    const char *backend;        /* --backend auto|mpi|nccl|self (NULL = auto) */
    const char *device;         /* --device cpu|cuda (NULL = cpu, or cuda on an nccl world):
                                   where the world's table keeps the model */
    /* the lab's own flags, in the order of its lab_flag table; NULL = not given */
    const char *flag_values[LAB_MAX_FLAGS];
    /* filled by lab_parse_args from the lab name */
    char answers_default[256];
    char results_default[256];
    char rubric_default[256];
    char template_default[256];
} lab_args;

/* Parses argv into *out (zeroed first, defaults for the paths filled from `lab`, e.g.
   "lab03"). Returns 0, or LAB_EXIT_USAGE with a one-line reason in err (e.g.
   "unknown flag --tpp", "--tp needs a positive integer, got 'x'", "--tp given twice").
   lab_parse_args_ex also accepts the lab's own flags (at most LAB_MAX_FLAGS). */
int lab_parse_args(int argc, char **argv, const char *lab, lab_args *out, char *err,
                   size_t err_cap);
int lab_parse_args_ex(int argc, char **argv, const char *lab, const lab_flag *flags,
                      int n_flags, lab_args *out, char *err, size_t err_cap);
/* The usage text; `lab_specific` (may be NULL) is appended verbatim. */
void lab_print_usage(FILE *f, const char *lab, const char *summary, const char *lab_specific);
/* MC_BACKEND_* for --backend, or -1 if the name is unknown. */
int lab_backend_from_name(const char *name);

/* ---------------------------------------------------------------------------------------------
   >>print  The harness remembers this process's world rank once the world exists; before
   that it reads the launcher's environment (Open MPI, PMI, PMIx, Slurm), so even code that
   runs before MPI_Init prints on one rank only. */

void lab_set_rank(int world_rank);
int lab_rank(void);
/* The rank the launcher gave this process, from its environment; 0 when not launched by one
   (a plain ./labNN). */
int lab_launcher_rank(void);
/* The rank on its node as the launcher sets it (0 when unknown): which GPU a rank takes. */
int lab_launcher_local_rank(void);
/* printf on world rank 0 only; flushes so output interleaves sensibly with other ranks. */
void lab_printf0(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* ---------------------------------------------------------------------------------------------
   >>collectives  Host-buffer collectives on any backend: the data goes through
   mc_comm_alloc / upload / download, so they work on NCCL device buffers too. Counts are
   elements. When a call times out the staging buffers are deliberately not freed: the
   unfinished operation may still write into them. */

int lab_all_reduce_i32(mc_comm *c, const int *send, int *recv, size_t count, mc_reduce_op op);
int lab_all_reduce_f64(mc_comm *c, const double *send, double *recv, size_t count,
                       mc_reduce_op op);
int lab_all_gather_i32(mc_comm *c, const int *send, int *recv, size_t count);
int lab_all_gather_f64(mc_comm *c, const double *send, double *recv, size_t count);
int lab_broadcast_bytes(mc_comm *c, void *buf, size_t bytes, int root);

/* ---------------------------------------------------------------------------------------------
   >>lists  Rank lists: printing and comparing (small n; order matters only for same_list). */

/* "[0,1,4,5]"; a list too long for cap ends in "...". */
void lab_format_ints(char *out, size_t cap, const int *v, int n);
int lab_ints_contain(const int *v, int n, int x);
int lab_ints_same_set(const int *a, int na, const int *b, int nb);
int lab_ints_same_list(const int *a, int na, const int *b, int nb);

/* calloc that stops the program with a message on failure (n or size 0 allocate 1 byte). */
void *lab_xcalloc(size_t n, size_t size);

/* ---------------------------------------------------------------------------------------------
   >>nonce  Per-learner nonce: 6 lower-case hex digits from /dev/urandom, written into the
   answer-sheet header by --init.

   Derivation (stable; changing it would re-deal every learner's probe and variant):
       h        = 32-bit FNV-1a over the nonce's characters
       probe    = h mod default_world          (the value printed in the header)
       variant  = 1 + ((h >> 16) mod n_variants)   ("F1", "F2", "F3" for three variants)
   In a world of any other size W the probe is `probe mod W` (lab_probe_in_world), so the
   header's probe rank stays the probe rank whenever it exists. */

#define LAB_NONCE_LEN 6
int lab_nonce_new(char out[LAB_NONCE_LEN + 1]);        /* 0, or -1 when no entropy source */
int lab_nonce_valid(const char *nonce);                /* 1 if 6 hex digits */
uint32_t lab_nonce_hash(const char *nonce);
int lab_nonce_probe_rank(const char *nonce, int default_world);
int lab_nonce_variant(const char *nonce, int n_variants);   /* 1-based */
int lab_probe_in_world(int probe, int world);

/* ---------------------------------------------------------------------------------------------
   >>time */

double lab_now(void);                            /* monotonic seconds */
/* "2026-11-30T04:00:00Z" (the current time in UTC); out needs 21 bytes. */
void lab_iso8601_utc(char *out, size_t cap);
double lab_median(double *values, int n);        /* sorts values in place */

/* ---------------------------------------------------------------------------------------------
   >>results  A small writer on top of cJSON. Build the document on rank 0, then write it:
   the parent directory is created when missing, the text goes to "<path>.tmp.<pid>" and is
   renamed over <path>, so a reader never sees half a file. */

/* {"lab": lab, "question": question, "rubric_version": rv, "megatron_c_version": "x.y.z"} */
cJSON *lab_results_new(const char *lab, const char *question, const char *rubric_version);
cJSON *lab_json_int_array(const int *values, int n);
/* [[...], [...]]: n_groups lists, group g holds sizes[g] ints starting at members[offsets[g]]. */
cJSON *lab_json_groups(const int *members, const int *offsets, const int *sizes, int n_groups);
/* Every group of `kind` in the grid, [[...], ...]; the members of `rank`'s group, or null. */
cJSON *lab_json_grid_groups(const mc_grid *grid, mc_group_kind kind);
cJSON *lab_json_grid_group_of(const mc_grid *grid, mc_group_kind kind, int rank);
int lab_json_write_atomic(const cJSON *doc, const char *path);   /* 0 or MC_ERR_IO */
/* The same for text (answer sheets, SVG figures). */
int lab_write_text_atomic(const char *text, const char *path);   /* 0 or MC_ERR_IO */
/* Whole file as a NUL-terminated string (caller frees), or NULL with errno set. */
char *lab_read_text(const char *path, size_t *len);
/* mkdir -p of the directory part of `path`. */
int lab_make_parent_dirs(const char *path);
/* "results/lab03.json" -> "results/lab03.grade.json" (what = "grade"), "results/lab03.ledger.json"
   (what = "ledger"), "results/lab03.timeline.svg" (what = "timeline", ext = "svg"). */
void lab_grade_path_from_results(const char *results_path, char *out, size_t cap);
void lab_path_beside_results(const char *results_path, const char *what, const char *ext,
                             char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* MC_LAB_COMMON_H_INCLUDED */
