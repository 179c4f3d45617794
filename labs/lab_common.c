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

#include "grader.h"

#if defined(MC_ENABLE_CUDA)
#include <cuda_runtime.h>
#include <nccl.h>
#endif

/* The collectives below move C ints as MC_I32. */
_Static_assert(sizeof(int) == 4, "lab_common assumes 32-bit int");

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
    case MC_ERR_CUDA:
        return "one NCCL communicator cannot hold two ranks on one GPU; start at most one "
               "rank per GPU or use --backend mpi";
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
            "  --timeout S        seconds before a call that never matches counts as a hang\n"
            "  --timing / --no-timing   measure all-reduce times (default: lab decides)\n"
            "  --answers FILE     answer sheet (default answers/%s.md)\n"
            "  --results FILE     results document (default results/%s.json)\n"
            "  --rubric FILE      rubric (default labs/rubric/%s.json)\n"
            "  --init             write the answer-sheet template with a fresh nonce, then exit\n"
            "  --force            let --init overwrite a sheet that already has answers\n"
            "  --grade-only       grade the sheet against the last results; no experiment\n"
            "  --json             also print the results document\n"
            "  --help             this text\n",
            lab, lab, lab);
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

static int lab__parse_seconds(const char *flag, const char *text, double *out, char *err,
                              size_t cap) {
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(v > 0.0) || v > 86400.0) {
        snprintf(err, cap, "%s needs seconds > 0, got '%s'", flag, text);
        return LAB_EXIT_USAGE;
    }
    *out = v;
    return 0;
}

typedef enum lab__opt_kind { LAB__SWITCH, LAB__SIZE, LAB__TEXT, LAB__SECONDS } lab__opt_kind;

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
    {"--answers", LAB__TEXT, LAB__FIELD(answers_path), 0},
    {"--results", LAB__TEXT, LAB__FIELD(results_path), 0},
    {"--rubric", LAB__TEXT, LAB__FIELD(rubric_path), 0},
    {"--timeout", LAB__SECONDS, LAB__FIELD(timeout_s), 0},
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

int lab_parse_args(int argc, char **argv, const char *lab, lab_args *out, char *err,
                   size_t err_cap) {
    memset(out, 0, sizeof *out);
    out->timing = -1;
    snprintf(out->answers_default, sizeof out->answers_default, "answers/%s.md", lab);
    snprintf(out->results_default, sizeof out->results_default, "results/%s.json", lab);
    snprintf(out->rubric_default, sizeof out->rubric_default, "labs/rubric/%s.json", lab);
    if (err_cap > 0) err[0] = '\0';

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
        const lab__opt *opt = lab__find_opt(name);
        if (opt == NULL) {
            snprintf(err, err_cap, "unknown %s '%s'", arg[0] == '-' ? "flag" : "argument", arg);
            return LAB_EXIT_USAGE;
        }
        char *field = (char *)out + opt->offset;
        if (opt->kind == LAB__SWITCH) {
            if (value != NULL) {
                snprintf(err, err_cap, "%s takes no value", opt->name);
                return LAB_EXIT_USAGE;
            }
            *(int *)field = opt->switch_value;
            continue;
        }
        if (value == NULL) {
            if (i + 1 >= argc) {
                snprintf(err, err_cap, "%s needs a value", opt->name);
                return LAB_EXIT_USAGE;
            }
            value = argv[++i];
        }
        int rc = 0;
        switch (opt->kind) {
        case LAB__SIZE:
            rc = lab__parse_positive(opt->name, value, (int *)field, err, err_cap);
            break;
        case LAB__SECONDS:
            rc = lab__parse_seconds(opt->name, value, (double *)field, err, err_cap);
            break;
        case LAB__TEXT:
            if (value[0] == '\0') {
                snprintf(err, err_cap, "%s needs a non-empty value", opt->name);
                return LAB_EXIT_USAGE;
            }
            *(const char **)field = value;
            break;
        case LAB__SWITCH:
            break;
        }
        if (rc != 0) return rc;
    }
    if (out->backend != NULL && lab_backend_from_name(out->backend) < 0) {
        snprintf(err, err_cap, "--backend must be auto, mpi, nccl or self, got '%s'",
                 out->backend);
        return LAB_EXIT_USAGE;
    }
    if (out->init && out->grade_only) {
        snprintf(err, err_cap, "--init and --grade-only cannot be combined");
        return LAB_EXIT_USAGE;
    }
    if (out->answers_path == NULL) out->answers_path = out->answers_default;
    if (out->results_path == NULL) out->results_path = out->results_default;
    if (out->rubric_path == NULL) out->rubric_path = out->rubric_default;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   >>collectives  Every helper stages through backend memory. A timed-out operation may still
   be pending inside the backend, so its buffers are leaked on purpose rather than freed under
   it; any other outcome frees them. */

static int lab__staged(mc_comm *c, const void *send, size_t send_bytes, void *recv,
                       size_t recv_bytes, int (*op)(mc_comm *, const void *, void *, void *),
                       void *op_arg) {
    void *dsend = mc_comm_alloc(c, send_bytes);
    void *drecv = mc_comm_alloc(c, recv_bytes);
    int rc = MC_ERR_NO_MEMORY;
    if (dsend != NULL && drecv != NULL) {
        rc = mc_comm_upload(c, dsend, send, send_bytes);
        if (rc == MC_OK) rc = op(c, dsend, drecv, op_arg);
        if (rc == MC_OK) rc = mc_comm_download(c, recv, drecv, recv_bytes);
    }
    if (rc == MC_ERR_TIMEOUT) return rc;   /* buffers may still be in use: leak them */
    if (dsend != NULL) mc_comm_free(c, dsend);
    if (drecv != NULL) mc_comm_free(c, drecv);
    return rc;
}

typedef struct lab__reduce_arg {
    size_t count;
    mc_dtype dtype;
    mc_reduce_op op;
} lab__reduce_arg;

static int lab__do_all_reduce(mc_comm *c, const void *s, void *r, void *arg) {
    const lab__reduce_arg *a = (const lab__reduce_arg *)arg;
    return mc_all_reduce(c, s, r, a->count, a->dtype, a->op);
}

static int lab__do_all_gather(mc_comm *c, const void *s, void *r, void *arg) {
    const lab__reduce_arg *a = (const lab__reduce_arg *)arg;
    return mc_all_gather(c, s, r, a->count, a->dtype);
}

static int lab__all_reduce(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt,
                           mc_reduce_op op) {
    if (c == NULL || count == 0) return MC_ERR_INVALID_ARG;
    lab__reduce_arg a = {count, dt, op};
    size_t bytes = count * mc_dtype_size(dt);
    return lab__staged(c, send, bytes, recv, bytes, lab__do_all_reduce, &a);
}

static int lab__all_gather(mc_comm *c, const void *send, void *recv, size_t count,
                           mc_dtype dt) {
    if (c == NULL || count == 0) return MC_ERR_INVALID_ARG;
    lab__reduce_arg a = {count, dt, MC_SUM};
    size_t bytes = count * mc_dtype_size(dt);
    return lab__staged(c, send, bytes, recv, bytes * (size_t)c->size, lab__do_all_gather, &a);
}

int lab_all_reduce_i32(mc_comm *c, const int *send, int *recv, size_t count, mc_reduce_op op) {
    return lab__all_reduce(c, send, recv, count, MC_I32, op);
}

int lab_all_reduce_f64(mc_comm *c, const double *send, double *recv, size_t count,
                       mc_reduce_op op) {
    return lab__all_reduce(c, send, recv, count, MC_F64, op);
}

int lab_all_gather_i32(mc_comm *c, const int *send, int *recv, size_t count) {
    return lab__all_gather(c, send, recv, count, MC_I32);
}

int lab_all_gather_f64(mc_comm *c, const double *send, double *recv, size_t count) {
    return lab__all_gather(c, send, recv, count, MC_F64);
}

int lab_broadcast_bytes(mc_comm *c, void *buf, size_t bytes, int root) {
    if (c == NULL || bytes == 0) return MC_ERR_INVALID_ARG;
    void *d = mc_comm_alloc(c, bytes);
    if (d == NULL) return MC_ERR_NO_MEMORY;
    int rc = mc_comm_upload(c, d, buf, bytes);
    if (rc == MC_OK) rc = mc_broadcast(c, d, bytes, MC_U8, root);
    if (rc == MC_OK) rc = mc_comm_download(c, buf, d, bytes);
    if (rc != MC_ERR_TIMEOUT) mc_comm_free(c, d);
    return rc;
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

int lab_json_write_atomic(const cJSON *doc, const char *path) {
    char *text = cJSON_Print(doc);
    if (text == NULL) return MC_ERR_NO_MEMORY;
    if (lab_make_parent_dirs(path) != 0) {
        fprintf(stderr, "cannot create the directory for %s: %s\n", path, strerror(errno));
        free(text);
        return MC_ERR_IO;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    int ok = f != NULL;
    if (ok) ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f != NULL && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        remove(tmp);
    }
    free(text);
    return ok ? MC_OK : MC_ERR_IO;
}

void lab_grade_path_from_results(const char *results_path, char *out, size_t cap) {
    size_t n = strlen(results_path);
    if (n > 5 && strcmp(results_path + n - 5, ".json") == 0)
        snprintf(out, cap, "%.*s.grade.json", (int)(n - 5), results_path);
    else
        snprintf(out, cap, "%s.grade.json", results_path);
}

void lab_mpi_library_version(char *out, size_t cap) {
    if (cap == 0) return;
    out[0] = '\0';
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return;
    text[len < (int)sizeof text ? len : (int)sizeof text - 1] = '\0';
    size_t line = strcspn(text, "\r\n");
    while (line > 0 && isspace((unsigned char)text[line - 1])) line--;
    snprintf(out, cap, "%.*s", (int)line, text);
}

/* ---------------------------------------------------------------------------------------------
   >>grading */

int lab_grade(const lab_args *args, int print) {
    if (lab_rank() != 0) return 0;   /* one grader, one score table, one grade file */
    char grade_path[4200];
    lab_grade_path_from_results(args->results_path, grade_path, sizeof grade_path);
    gr_grade_desc desc = {
        .rubric_path = args->rubric_path,
        .answers_path = args->answers_path,
        .results_path = args->results_path,
        .grade_out_path = grade_path,
        .out = stdout,
        .quiet = print ? 0 : 1,
    };
    fflush(stdout);
    int rc = gr_grade(&desc, NULL);
    fflush(stdout);
    return rc;
}

int lab_init_answers(const lab_args *args, int default_world, int n_variants, int force) {
    char nonce[LAB_NONCE_LEN + 1];
    if (lab_nonce_new(nonce) != 0) {
        fprintf(stderr, "cannot read /dev/urandom to draw a nonce\n");
        return LAB_EXIT_FAILED;
    }
    int probe = lab_nonce_probe_rank(nonce, default_world);
    char variant[8];
    snprintf(variant, sizeof variant, "F%d", lab_nonce_variant(nonce, n_variants));
    if (lab_make_parent_dirs(args->answers_path) != 0) {
        fprintf(stderr, "cannot create the directory for %s: %s\n", args->answers_path,
                strerror(errno));
        return LAB_EXIT_FAILED;
    }
    int rc = gr_write_template(args->rubric_path, args->answers_path, nonce, probe,
                                     variant, force);
    if (rc == 1) {
        fprintf(stderr,
                "%s already holds answers; not overwritten.\n"
                "Pass --force to replace it with a fresh template (your answers will be lost).\n",
                args->answers_path);
        return LAB_EXIT_FAILED;
    }
    if (rc != 0) {
        fprintf(stderr, "could not write the template %s from the rubric %s (status %d)\n",
                args->answers_path, args->rubric_path, rc);
        return LAB_EXIT_FAILED;
    }
    printf("wrote %s: nonce %s, probe rank %d, follow-up %s\n", args->answers_path, nonce,
           probe, variant);
    return LAB_EXIT_OK;
}
