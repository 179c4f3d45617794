/* labs/lab_common.c - the harness every lab shares. See lab_common.h. */
#include "lab_common.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#if defined(MC_ENABLE_CUDA)
#include <cuda_runtime.h>
#include <nccl.h>
#endif

/* The collectives below move C ints as MC_I32. */
_Static_assert(sizeof(int) == 4, "lab_common assumes 32-bit int");

/* ---------------------------------------------------------------------------------------------
   >>build  The Makefile passes the commit (see BUILD_COMMIT there); a compiler run without it
   (a hand-written link line, a tarball's own build) reads "unknown". */

#ifndef LAB_BUILD_COMMIT
#define LAB_BUILD_COMMIT "unknown"
#endif
#ifndef LAB_BUILD_DIRTY
#define LAB_BUILD_DIRTY -1
#endif

const char *lab_build_commit(void) { return LAB_BUILD_COMMIT[0] ? LAB_BUILD_COMMIT : "unknown"; }
int lab_build_dirty(void) { return LAB_BUILD_DIRTY; }

/* ---------------------------------------------------------------------------------------------
   >>print */

static int lab__rank = -1;   /* -1 until the world exists */

void lab_set_rank(int world_rank) { lab__rank = world_rank; }

int lab_launcher_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                       "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v != NULL && *v != '\0') return atoi(v);
    }
    return 0;
}

int lab_launcher_local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v != NULL && *v != '\0') return atoi(v);
    }
    return 0;
}

int lab_rank(void) { return lab__rank >= 0 ? lab__rank : lab_launcher_rank(); }

void lab_printf0(const char *fmt, ...) {
    if (lab_rank() != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* ---------------------------------------------------------------------------------------------
   >>check */

void lab_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

/* Setup mistakes that come up again and again, keyed by status. */
static const char *lab__hint_for(int status) {
    switch (status) {
    case MC_ERR_INVALID_DESC:
        return "the sizes do not fit the number of ranks: check -np against --tp/--pp/--cp "
               "(world must be a multiple of tp*pp*cp)";
    case MC_ERR_TIMEOUT:
        return "a peer never joined the call: every rank must make the same collective calls "
               "in the same order (or raise --timeout on a slow machine)";
    case MC_ERR_PLAN_MISMATCH:
        return "ranks were started with different flags or binaries; start every rank with "
               "the same command line";
    case MC_ERR_UNSUPPORTED:
        return "this build lacks the backend asked for (build with CUDA=1 for nccl, with "
               "mpicc for mpi)";
    case MC_ERR_NCCL:
        return "one NCCL communicator cannot hold two ranks on one GPU; start at most one "
               "rank per GPU or use --backend mpi";
    case MC_ERR_CUDA:
        return "the CUDA call above failed; is a GPU visible to this rank (nvidia-smi, "
               "CUDA_VISIBLE_DEVICES)? On nccl one communicator cannot hold two ranks of one "
               "GPU: start at most one rank per GPU, or use --backend mpi";
    default:
        return NULL;
    }
}

void lab_mc_check(int status, const char *expr, const char *file, int line) {
    if (status == MC_OK) return;
    const char *detail = mc_last_error();
    fprintf(stderr, "[rank %d] %s failed at %s:%d\n  %s: %s\n%s%s%s", lab_rank(), expr, file,
            line, mc_err_name(status), mc_strerror(status), detail[0] ? "  " : "", detail,
            detail[0] ? "\n" : "");
    const char *hint = lab__hint_for(status);
    if (hint != NULL) fprintf(stderr, "---> HINT: %s\n", hint);
    lab_abort(LAB_EXIT_FAILED);
}

void lab_mpi_check(int mpi_status, const char *expr, const char *file, int line) {
    if (mpi_status == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mpi_status, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", mpi_status);
    fprintf(stderr, "[rank %d] %s failed at %s:%d\n  MPI: %s\n", lab_rank(), expr, file, line,
            text);
    fprintf(stderr, "---> HINT: start the lab with mpirun (as root add --allow-run-as-root)\n");
    lab_abort(LAB_EXIT_FAILED);
}

#if defined(MC_ENABLE_CUDA)
void lab_cuda_check(int cuda_status, const char *expr, const char *file, int line) {
    if (cuda_status == (int)cudaSuccess) return;
    fprintf(stderr, "[rank %d] %s failed at %s:%d\n  CUDA: %s\n", lab_rank(), expr, file, line,
            cudaGetErrorString((cudaError_t)cuda_status));
    fprintf(stderr, "---> HINT: is a GPU visible to this rank? (nvidia-smi, "
                    "CUDA_VISIBLE_DEVICES)\n");
    lab_abort(LAB_EXIT_FAILED);
}

void lab_nccl_check(int nccl_status, const char *expr, const char *file, int line) {
    if (nccl_status == (int)ncclSuccess) return;
    fprintf(stderr, "[rank %d] %s failed at %s:%d\n  NCCL: %s\n", lab_rank(), expr, file, line,
            ncclGetErrorString((ncclResult_t)nccl_status));
    fprintf(stderr, "---> HINT: run with NCCL_DEBUG=WARN for details; one communicator "
                    "cannot hold two ranks on one GPU\n");
    lab_abort(LAB_EXIT_FAILED);
}
#endif

/* ---------------------------------------------------------------------------------------------
   >>args */

int lab_backend_from_name(const char *name) {
    if (name == NULL || strcmp(name, "auto") == 0) return MC_BACKEND_AUTO;
    if (strcmp(name, "self") == 0) return MC_BACKEND_SELF;
    if (strcmp(name, "mpi") == 0) return MC_BACKEND_MPI;
    if (strcmp(name, "nccl") == 0) return MC_BACKEND_NCCL;
    return -1;
}

void lab_print_usage(FILE *f, const char *lab, const char *summary, const char *lab_specific) {
    fprintf(f,
            "usage: mpirun -np N ./%s [flags]      (as root add --allow-run-as-root)\n"
            "       ./%s --init | --grade-only | --help   (no mpirun needed)\n",
            lab, lab);
    if (summary != NULL) fprintf(f, "\n%s\n", summary);
    fprintf(f,
            "\nflags:\n"
            "  --tp N --pp N --cp N --ep N --etp N --vpp N   parallel sizes (DP is derived)\n"
            "  --order S          rank order, fastest axis first (default tp-cp-ep-dp-pp)\n"
            "  --backend NAME     auto (default), mpi, nccl or self\n"
            "  --device cpu|cuda  where the model lives: cpu (default; nccl worlds always\n"
            "                     cuda), or cuda: one GPU per rank, or ranks sharing a GPU\n"
            "                     with MPI staging each collective through the host\n"
            "  --timeout S        seconds before a call that never matches counts as a hang\n"
            "  --distributed-timeout-minutes M   timeout of every collective on the world and\n"
            "                     its groups (default: 30 s, or 3x --timeout when longer)\n"
            "  --timing / --no-timing   measure all-reduce times (default: lab decides)\n"
            "  --quick            the lab's shortest meaningful run\n"
            "  --answers FILE     answer sheet (default answers/%s.md)\n"
            "  --results FILE     results document (default results/%s.json)\n"
            "  --rubric FILE      rubric (default labs/rubric/%s.json)\n"
            "  --template FILE    answer-sheet template (default labs/templates/%s.md)\n"
            "  --nonce HEX        use this 6-hex-digit nonce instead of the sheet's (tests)\n"
            "  --init             write the answer-sheet template with a fresh nonce, then exit\n"
            "  --force            let --init overwrite a sheet that already has answers\n"
            "  --grade-only       grade the sheet against the last results; no experiment\n"
            "  --json             also print the results document\n"
            "  --help             this text\n"
            "exit status: 0 every check held, 1 a check failed, 2 bad flags or a world the lab\n"
            "cannot use\n",
            lab, lab, lab, lab);
    if (lab_specific != NULL) fprintf(f, "%s", lab_specific);
}

static int lab__parse_positive(const char *flag, const char *text, int *out, char *err,
                               size_t cap) {
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < 1 || v > MC_MAX_RANKS) {
        snprintf(err, cap, "%s needs a positive integer, got '%s'", flag, text);
        return LAB_EXIT_USAGE;
    }
    *out = (int)v;
    return 0;
}

/* A duration in (0, max]: "--timeout" in seconds (max one day), the Megatron-style
   "--distributed-timeout-minutes" in minutes (max one week). */
static int lab__parse_duration(const char *flag, const char *text, const char *unit, double max,
                               double *out, char *err, size_t cap) {
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(v > 0.0) || v > max) {
        snprintf(err, cap, "%s needs %s > 0 (at most %g), got '%s'", flag, unit, max, text);
        return LAB_EXIT_USAGE;
    }
    *out = v;
    return 0;
}

typedef enum lab__opt_kind {
    LAB__SWITCH, LAB__SIZE, LAB__TEXT, LAB__SECONDS, LAB__MINUTES
} lab__opt_kind;

typedef struct lab__opt {
    const char *name;
    lab__opt_kind kind;
    size_t offset;        /* field in lab_args */
    int switch_value;     /* value stored by a switch */
} lab__opt;

#define LAB__FIELD(f) offsetof(lab_args, f)
static const lab__opt lab__opts[] = {
    {"--tp", LAB__SIZE, LAB__FIELD(tp), 0},
    {"--pp", LAB__SIZE, LAB__FIELD(pp), 0},
    {"--cp", LAB__SIZE, LAB__FIELD(cp), 0},
    {"--ep", LAB__SIZE, LAB__FIELD(ep), 0},
    {"--etp", LAB__SIZE, LAB__FIELD(etp), 0},
    {"--vpp", LAB__SIZE, LAB__FIELD(vpp), 0},
    {"--order", LAB__TEXT, LAB__FIELD(order), 0},
    {"--backend", LAB__TEXT, LAB__FIELD(backend), 0},
    {"--device", LAB__TEXT, LAB__FIELD(device), 0},
    {"--answers", LAB__TEXT, LAB__FIELD(answers_path), 0},
    {"--results", LAB__TEXT, LAB__FIELD(results_path), 0},
    {"--rubric", LAB__TEXT, LAB__FIELD(rubric_path), 0},
    {"--template", LAB__TEXT, LAB__FIELD(template_path), 0},
    {"--nonce", LAB__TEXT, LAB__FIELD(nonce), 0},
    {"--timeout", LAB__SECONDS, LAB__FIELD(timeout_s), 0},
    {"--distributed-timeout-minutes", LAB__MINUTES, LAB__FIELD(world_timeout_min), 0},
    {"--quick", LAB__SWITCH, LAB__FIELD(quick), 1},
    {"--init", LAB__SWITCH, LAB__FIELD(init), 1},
    {"--force", LAB__SWITCH, LAB__FIELD(force), 1},
    {"--grade-only", LAB__SWITCH, LAB__FIELD(grade_only), 1},
    {"--json", LAB__SWITCH, LAB__FIELD(json), 1},
    {"--help", LAB__SWITCH, LAB__FIELD(help), 1},
    {"-h", LAB__SWITCH, LAB__FIELD(help), 1},
    {"--timing", LAB__SWITCH, LAB__FIELD(timing), 1},
    {"--no-timing", LAB__SWITCH, LAB__FIELD(timing), 0},
};

static const lab__opt *lab__find_opt(const char *name) {
    for (size_t i = 0; i < sizeof lab__opts / sizeof lab__opts[0]; i++)
        if (strcmp(lab__opts[i].name, name) == 0) return &lab__opts[i];
    return NULL;
}

/* One flag of argv, resolved: where its value goes and which name set that place first (a
   place set twice, like --tp 2 --tp 4 or --timing --no-timing, is refused). */
typedef struct lab__target {
    const char *name;
    lab__opt_kind kind;
    void *field;
    int switch_value;
    int lab_flag;        /* 1: one of the lab's own flags (a const char * slot) */
} lab__target;

static int lab__resolve(const char *name, const lab_flag *flags, int n_flags, lab_args *out,
                        lab__target *t) {
    const lab__opt *opt = lab__find_opt(name);
    if (opt != NULL) {
        *t = (lab__target){opt->name, opt->kind, (char *)out + opt->offset, opt->switch_value, 0};
        return 1;
    }
    for (int k = 0; k < n_flags; k++) {
        if (strcmp(flags[k].name, name) != 0) continue;
        *t = (lab__target){flags[k].name, flags[k].takes_value ? LAB__TEXT : LAB__SWITCH,
                           &out->flag_values[k], 0, 1};
        return 1;
    }
    return 0;
}

static int lab__store(const lab__target *t, const char *value, char *err, size_t cap) {
    switch (t->kind) {
    case LAB__SIZE:
        return lab__parse_positive(t->name, value, (int *)t->field, err, cap);
    case LAB__SECONDS:
        return lab__parse_duration(t->name, value, "seconds", 86400.0, (double *)t->field, err,
                                   cap);
    case LAB__MINUTES:
        return lab__parse_duration(t->name, value, "minutes", 10080.0, (double *)t->field, err,
                                   cap);
    case LAB__TEXT:
        if (value[0] == '\0') {
            snprintf(err, cap, "%s needs a non-empty value", t->name);
            return LAB_EXIT_USAGE;
        }
        *(const char **)t->field = value;
        return 0;
    case LAB__SWITCH:
        break;
    }
    return 0;
}

static int lab__check_combined(const lab_args *out, char *err, size_t cap) {
    if (out->backend != NULL && lab_backend_from_name(out->backend) < 0) {
        snprintf(err, cap, "--backend must be auto, mpi, nccl or self, got '%s'", out->backend);
        return LAB_EXIT_USAGE;
    }
    if (out->device != NULL && strcmp(out->device, "cpu") != 0 &&
        strcmp(out->device, "cuda") != 0) {
        snprintf(err, cap, "--device must be cpu or cuda, got '%s'", out->device);
        return LAB_EXIT_USAGE;
    }
    if (out->nonce != NULL && !lab_nonce_valid(out->nonce)) {
        snprintf(err, cap, "--nonce needs 6 hex digits, got '%s'", out->nonce);
        return LAB_EXIT_USAGE;
    }
    if (out->init && out->grade_only) {
        snprintf(err, cap, "--init and --grade-only cannot be combined");
        return LAB_EXIT_USAGE;
    }
    return 0;
}

int lab_parse_args_ex(int argc, char **argv, const char *lab, const lab_flag *flags,
                      int n_flags, lab_args *out, char *err, size_t err_cap) {
    enum { MAX_SET = 64 };
    const void *set_field[MAX_SET];
    const char *set_by[MAX_SET];
    int n_set = 0;
    memset(out, 0, sizeof *out);
    out->timing = -1;
    snprintf(out->answers_default, sizeof out->answers_default, "answers/%s.md", lab);
    snprintf(out->results_default, sizeof out->results_default, "results/%s.json", lab);
    snprintf(out->rubric_default, sizeof out->rubric_default, "labs/rubric/%s.json", lab);
    snprintf(out->template_default, sizeof out->template_default, "labs/templates/%s.md", lab);
    if (err_cap > 0) err[0] = '\0';
    if (n_flags < 0 || n_flags > LAB_MAX_FLAGS) {
        snprintf(err, err_cap, "%s declares %d flags of its own, at most %d", lab, n_flags,
                 LAB_MAX_FLAGS);
        return LAB_EXIT_USAGE;
    }

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        /* "--tp=2" is accepted as well as "--tp 2" */
        char name[64];
        const char *value = NULL;
        const char *eq = strchr(arg, '=');
        if (arg[0] == '-' && arg[1] == '-' && eq != NULL && (size_t)(eq - arg) < sizeof name) {
            memcpy(name, arg, (size_t)(eq - arg));
            name[eq - arg] = '\0';
            value = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        lab__target t;
        if (!lab__resolve(name, flags, n_flags, out, &t)) {
            snprintf(err, err_cap, "unknown %s '%s'", arg[0] == '-' ? "flag" : "argument", arg);
            return LAB_EXIT_USAGE;
        }
        for (int k = 0; k < n_set; k++) {
            if (set_field[k] != t.field) continue;
            if (strcmp(set_by[k], t.name) == 0)
                snprintf(err, err_cap, "%s given twice", t.name);
            else
                snprintf(err, err_cap, "%s and %s cannot be combined", set_by[k], t.name);
            return LAB_EXIT_USAGE;
        }
        if (n_set < MAX_SET) {
            set_field[n_set] = t.field;
            set_by[n_set++] = t.name;
        }
        if (t.kind == LAB__SWITCH) {
            if (value != NULL) {
                snprintf(err, err_cap, "%s takes no value", t.name);
                return LAB_EXIT_USAGE;
            }
            if (t.lab_flag)
                *(const char **)t.field = "1";
            else
                *(int *)t.field = t.switch_value;
            continue;
        }
        if (value == NULL) {
            if (i + 1 >= argc) {
                snprintf(err, err_cap, "%s needs a value", t.name);
                return LAB_EXIT_USAGE;
            }
            value = argv[++i];
        }
        int rc = lab__store(&t, value, err, err_cap);
        if (rc != 0) return rc;
    }
    int rc = lab__check_combined(out, err, err_cap);
    if (rc != 0) return rc;
    if (out->answers_path == NULL) out->answers_path = out->answers_default;
    if (out->results_path == NULL) out->results_path = out->results_default;
    if (out->rubric_path == NULL) out->rubric_path = out->rubric_default;
    if (out->template_path == NULL) out->template_path = out->template_default;
    return 0;
}

int lab_parse_args(int argc, char **argv, const char *lab, lab_args *out, char *err,
                   size_t err_cap) {
    return lab_parse_args_ex(argc, argv, lab, NULL, 0, out, err, err_cap);
}

/* ---------------------------------------------------------------------------------------------
   >>collectives  Host values through mc_host_collective, which stages them through the
   communicator's memory (device buffers on nccl). */

static int lab__host(mc_comm *c, mc_collective kind, const void *send, void *recv, size_t count,
                     mc_dtype dt, mc_reduce_op op, int root) {
    if (c == NULL || count == 0) return MC_ERR_INVALID_ARG;
    return mc_host_collective(c, kind, send, recv, count, dt, op, root);
}

int lab_all_reduce_i32(mc_comm *c, const int *send, int *recv, size_t count, mc_reduce_op op) {
    return lab__host(c, MC_COLL_ALL_REDUCE, send, recv, count, MC_I32, op, 0);
}

int lab_all_reduce_f64(mc_comm *c, const double *send, double *recv, size_t count,
                       mc_reduce_op op) {
    return lab__host(c, MC_COLL_ALL_REDUCE, send, recv, count, MC_F64, op, 0);
}

int lab_all_gather_i32(mc_comm *c, const int *send, int *recv, size_t count) {
    return lab__host(c, MC_COLL_ALL_GATHER, send, recv, count, MC_I32, MC_SUM, 0);
}

int lab_all_gather_f64(mc_comm *c, const double *send, double *recv, size_t count) {
    return lab__host(c, MC_COLL_ALL_GATHER, send, recv, count, MC_F64, MC_SUM, 0);
}

int lab_broadcast_bytes(mc_comm *c, void *buf, size_t bytes, int root) {
    return lab__host(c, MC_COLL_BROADCAST, buf, buf, bytes, MC_U8, MC_SUM, root);
}

/* ---------------------------------------------------------------------------------------------
   >>lists */

void lab_format_ints(char *out, size_t cap, const int *v, int n) {
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

int lab_ints_contain(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

int lab_ints_same_set(const int *a, int na, const int *b, int nb) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (!lab_ints_contain(b, nb, a[i])) return 0;
    return 1;
}

int lab_ints_same_list(const int *a, int na, const int *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

void *lab_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        fprintf(stderr, "[rank %d] out of memory (%zu x %zu bytes)\n", lab_rank(), n, size);
        lab_abort(LAB_EXIT_FAILED);
    }
    return p;
}

/* ---------------------------------------------------------------------------------------------
   >>nonce */

int lab_nonce_new(char out[LAB_NONCE_LEN + 1]) {
    unsigned char bytes[LAB_NONCE_LEN / 2];
    FILE *f = fopen("/dev/urandom", "rb");
    if (f == NULL) return -1;
    size_t got = fread(bytes, 1, sizeof bytes, f);
    fclose(f);
    if (got != sizeof bytes) return -1;
    for (size_t i = 0; i < sizeof bytes; i++) snprintf(out + 2 * i, 3, "%02x", bytes[i]);
    out[LAB_NONCE_LEN] = '\0';
    return 0;
}

int lab_nonce_valid(const char *nonce) {
    if (nonce == NULL || strlen(nonce) != LAB_NONCE_LEN) return 0;
    for (int i = 0; i < LAB_NONCE_LEN; i++)
        if (!isxdigit((unsigned char)nonce[i])) return 0;
    return 1;
}

uint32_t lab_nonce_hash(const char *nonce) {
    uint32_t h = 2166136261u;   /* FNV-1a offset basis */
    for (const char *p = nonce; p != NULL && *p != '\0'; p++) {
        h ^= (uint32_t)(unsigned char)tolower((unsigned char)*p);
        h *= 16777619u;         /* FNV prime */
    }
    return h;
}

int lab_nonce_probe_rank(const char *nonce, int default_world) {
    if (default_world < 1) return 0;
    return (int)(lab_nonce_hash(nonce) % (uint32_t)default_world);
}

int lab_nonce_variant(const char *nonce, int n_variants) {
    if (n_variants < 1) return 1;
    return 1 + (int)((lab_nonce_hash(nonce) >> 16) % (uint32_t)n_variants);
}

int lab_probe_in_world(int probe, int world) { return world > 0 ? probe % world : 0; }

/* ---------------------------------------------------------------------------------------------
   >>time */

double lab_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void lab_iso8601_utc(char *out, size_t cap) {
    time_t now = time(NULL);
    struct tm tm_utc;
    gmtime_r(&now, &tm_utc);
    if (strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm_utc) == 0 && cap > 0) out[0] = '\0';
}

static int lab__cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double lab_median(double *values, int n) {
    if (n <= 0) return 0.0;
    qsort(values, (size_t)n, sizeof *values, lab__cmp_double);
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/* ---------------------------------------------------------------------------------------------
   >>results */

cJSON *lab_results_new(const char *lab, const char *question, const char *rubric_version) {
    cJSON *doc = cJSON_CreateObject();
    if (doc == NULL) return NULL;
    cJSON_AddStringToObject(doc, "lab", lab);
    cJSON_AddStringToObject(doc, "question", question);
    cJSON_AddStringToObject(doc, "rubric_version", rubric_version);
    cJSON_AddStringToObject(doc, "megatron_c_version", mc_version_string());
    return doc;
}

cJSON *lab_json_int_array(const int *values, int n) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr != NULL && i < n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(values[i]));
    return arr;
}

cJSON *lab_json_groups(const int *members, const int *offsets, const int *sizes, int n_groups) {
    cJSON *arr = cJSON_CreateArray();
    for (int g = 0; arr != NULL && g < n_groups; g++)
        cJSON_AddItemToArray(arr, lab_json_int_array(members + offsets[g], sizes[g]));
    return arr;
}

cJSON *lab_json_grid_groups(const mc_grid *grid, mc_group_kind kind) {
    cJSON *arr = cJSON_CreateArray();
    int ng = mc_grid_num_groups(grid, kind);
    int *m = lab_xcalloc((size_t)grid->desc.world, sizeof(int));
    for (int g = 0; g < ng; g++) {
        int n = mc_grid_group_members(grid, kind, g, m, grid->desc.world);
        cJSON_AddItemToArray(arr, lab_json_int_array(m, n < 0 ? 0 : n));
    }
    free(m);
    return arr;
}

cJSON *lab_json_grid_group_of(const mc_grid *grid, mc_group_kind kind, int rank) {
    int gi = -1;
    if (mc_grid_group_of(grid, kind, rank, &gi, NULL) != MC_OK || gi < 0)
        return cJSON_CreateNull();
    int *m = lab_xcalloc((size_t)grid->desc.world, sizeof(int));
    int n = mc_grid_group_members(grid, kind, gi, m, grid->desc.world);
    cJSON *arr = lab_json_int_array(m, n < 0 ? 0 : n);
    free(m);
    return arr;
}

int lab_make_parent_dirs(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) return 0;   /* current directory */
    *slash = '\0';
    for (char *p = dir + 1; *p != '\0'; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(dir, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (dir[0] != '\0' && mkdir(dir, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}

int lab_write_text_atomic(const char *text, const char *path) {
    if (lab_make_parent_dirs(path) != 0) {
        fprintf(stderr, "cannot create the directory for %s: %s\n", path, strerror(errno));
        return MC_ERR_IO;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    int ok = f != NULL;
    if (ok) ok = fputs(text, f) >= 0;
    if (f != NULL && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        remove(tmp);
    }
    return ok ? MC_OK : MC_ERR_IO;
}

int lab_json_write_atomic(const cJSON *doc, const char *path) {
    char *text = cJSON_Print(doc);
    if (text == NULL) return MC_ERR_NO_MEMORY;
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);   /* the document ends with a newline */
    if (line == NULL) {
        free(text);
        return MC_ERR_NO_MEMORY;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    int rc = lab_write_text_atomic(line, path);
    free(line);
    return rc;
}

char *lab_read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *bigger = realloc(buf, cap * 2);
        if (bigger == NULL) {
            free(buf);
            buf = NULL;
            errno = ENOMEM;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (buf == NULL) return NULL;
    if (failed) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = '\0';
    if (len != NULL) *len = n;
    return buf;
}

void lab_path_beside_results(const char *results_path, const char *what, const char *ext,
                             char *out, size_t cap) {
    size_t n = strlen(results_path);
    int stem = n > 5 && strcmp(results_path + n - 5, ".json") == 0 ? (int)(n - 5) : (int)n;
    snprintf(out, cap, "%.*s.%s.%s", stem, results_path, what, ext);
}

void lab_grade_path_from_results(const char *results_path, char *out, size_t cap) {
    lab_path_beside_results(results_path, "grade", "json", out, cap);
}
