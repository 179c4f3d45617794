/* tests/test_util.h - helpers shared by the Criterion suites and the MPI case programs.

   Header-only: every function is static inline, so a file pays nothing (and gets no
   "unused" warning) for the helpers it does not call.
     - process helpers (any file): mc_test_run, mc_test_mpirun, mc_test_sibling,
       mc_test_summary, mc_test_contains, mc_test_now;
     - mc_test_allclose: include <criterion/criterion.h> first (it reports through cr_expect);
     - mc_case_*: include "megatron_c.h" first; the check-and-count helpers of the
       tests/mpi_cases programs, which end with "N passed, N failed" on rank 0;
     - mc_test_json_at: include <cjson/cJSON.h> first; a value of a results file by its
       dotted path ("facts.probe.rank"); mc_test_json_load: a JSON file, parsed;
     - mc_test_make_tmpdir / mc_test_remove_dir: a scratch directory under /tmp per test.

       char out[1 << 16];
       int rc = mc_test_mpirun(4, "build/tests/comm_cases allreduce", 60, out, sizeof out);
       cr_assert_eq(rc, 0, "%s", out);
       cr_assert(mc_test_contains(out, " 0 failed"));

   Why the process helpers exist: a Criterion binary must never run under mpirun, so a test
   that needs several ranks launches a separate MPI program and judges its exit status and
   output. Criterion's worker environment (BXFI_MAP) makes MPI children abort, so it is
   removed from the child's environment; a stuck launch is killed with all its processes
   so that no rank outlives the test. */
#ifndef MC_TEST_UTIL_H_INCLUDED
#define MC_TEST_UTIL_H_INCLUDED

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Seconds on a monotonic clock, for deadlines and "finished within N s" checks. */
static inline double mc_test_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int mc_test_contains(const char *haystack, const char *needle) {
    return haystack != NULL && needle != NULL && strstr(haystack, needle) != NULL;
}

/* ---------------------------------------------------------------------------------------------
   Output capture. When a child writes more than the caller's buffer holds, the head and the
   tail are kept (the tail carries the summary line, the head the first failure) with a marker
   in between. */

#define MC_TEST__CUT_MARK "\n[... output truncated ...]\n"

typedef struct mc_test__capture {
    char *out;          /* caller's buffer */
    size_t cap;         /* its size, >= 1 */
    size_t head_cap;    /* bytes kept from the start */
    size_t head_len;
    char *tail;         /* ring of the most recent bytes once the head is full */
    size_t tail_cap;
    size_t tail_pos;    /* next write position in the ring */
    size_t tail_len;    /* bytes held in the ring (<= tail_cap) */
    size_t total;       /* every byte the child wrote */
} mc_test__capture;

static inline void mc_test__capture_init(mc_test__capture *cp, char *out, size_t cap) {
    memset(cp, 0, sizeof *cp);
    cp->out = out;
    cp->cap = cap;
    size_t usable = cap > 0 ? cap - 1 : 0;   /* room for the terminating NUL */
    size_t mark = sizeof(MC_TEST__CUT_MARK) - 1;
    if (usable > 4 * mark) {
        cp->head_cap = (usable - mark) / 2;
        cp->tail_cap = usable - mark - cp->head_cap;
        cp->tail = (char *)malloc(cp->tail_cap);
        if (cp->tail == NULL) cp->tail_cap = 0;
    } else {
        cp->head_cap = usable;   /* tiny buffer: keep the head only */
    }
}

static inline void mc_test__capture_add(mc_test__capture *cp, const char *data, size_t n) {
    cp->total += n;
    size_t to_head = cp->head_cap - cp->head_len;
    if (to_head > n) to_head = n;
    memcpy(cp->out + cp->head_len, data, to_head);
    cp->head_len += to_head;
    data += to_head;
    n -= to_head;
    for (size_t i = 0; i < n && cp->tail_cap > 0; i++) {
        cp->tail[cp->tail_pos] = data[i];
        cp->tail_pos = (cp->tail_pos + 1) % cp->tail_cap;
        if (cp->tail_len < cp->tail_cap) cp->tail_len++;
    }
}

/* Writes head [+ marker] + tail into the caller's buffer, NUL-terminated. */
static inline void mc_test__capture_finish(mc_test__capture *cp) {
    if (cp->cap == 0) {
        free(cp->tail);
        return;
    }
    size_t len = cp->head_len;
    size_t kept = cp->head_len + cp->tail_len;
    if (cp->tail_len > 0) {
        if (kept < cp->total) {   /* bytes were dropped between head and tail */
            memcpy(cp->out + len, MC_TEST__CUT_MARK, sizeof(MC_TEST__CUT_MARK) - 1);
            len += sizeof(MC_TEST__CUT_MARK) - 1;
        }
        size_t start = (cp->tail_pos + cp->tail_cap - cp->tail_len) % cp->tail_cap;
        for (size_t i = 0; i < cp->tail_len; i++)
            cp->out[len++] = cp->tail[(start + i) % cp->tail_cap];
    }
    cp->out[len] = '\0';
    free(cp->tail);
}

/* ---------------------------------------------------------------------------------------------
   Killing a launch. mpirun puts every rank in a process group of its own, so killing the
   shell's group alone would leave the ranks running; the descendants are found through
   /proc (while their parents still live) and killed one by one, then the group. */

static inline int mc_test__parent_of(int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close_paren = strrchr(buf, ')');   /* the command name may hold spaces */
    int ppid = -1;
    if (close_paren == NULL || sscanf(close_paren + 1, " %*c %d", &ppid) != 1) return -1;
    return ppid;
}

static inline void mc_test__kill_tree(pid_t root) {
    enum { MAX_PIDS = 4096 };
    static int pids[MAX_PIDS], parents[MAX_PIDS], doomed[MAX_PIDS];
    int n = 0;
    DIR *proc = opendir("/proc");
    if (proc != NULL) {
        struct dirent *e;
        while ((e = readdir(proc)) != NULL && n < MAX_PIDS) {
            int pid = atoi(e->d_name);
            if (pid <= 0) continue;
            pids[n] = pid;
            parents[n] = mc_test__parent_of(pid);
            n++;
        }
        closedir(proc);
    }
    int n_doomed = 0;
    doomed[n_doomed++] = (int)root;
    for (int head = 0; head < n_doomed; head++)   /* breadth-first over the process tree */
        for (int i = 0; i < n && n_doomed < MAX_PIDS; i++)
            if (parents[i] == doomed[head]) doomed[n_doomed++] = pids[i];
    kill(-root, SIGKILL);
    for (int i = 0; i < n_doomed; i++) kill((pid_t)doomed[i], SIGKILL);
}

/* ---------------------------------------------------------------------------------------------
   mc_test_run: runs `cmd` through /bin/sh -c in its own process group, BXFI_MAP removed from
   its environment, stdout and stderr captured together into out (always NUL-terminated).
   Returns the exit status, 128 + signal when the shell was killed by a signal, or -1 when
   timeout_s passed (the process group and every descendant are then killed with SIGKILL)
   or the launch failed. */
static inline int mc_test_run(const char *cmd, double timeout_s, char *out, size_t out_cap) {
    if (out != NULL && out_cap > 0) out[0] = '\0';
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        unsetenv("BXFI_MAP");
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);   /* also here, so the kill below cannot race the child's setpgid */
    close(fds[1]);

    char scratch[1];
    mc_test__capture cap;
    mc_test__capture_init(&cap, out != NULL ? out : scratch, out != NULL ? out_cap : 1);
    double deadline = mc_test_now() + timeout_s;
    int timed_out = 0;
    for (;;) {
        double left = deadline - mc_test_now();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        int ready = poll(&pfd, 1, (int)(left * 1000.0) + 1);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) continue;   /* loop re-checks the deadline */
        char chunk[4096];
        ssize_t n = read(fds[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;   /* EOF: every writer (shell, launcher, ranks) has gone */
        mc_test__capture_add(&cap, chunk, (size_t)n);
    }
    close(fds[0]);

    /* The output is closed; the shell may still run (it can close its output early), so
       the deadline still holds while waiting for it. */
    int status = 0;
    for (;;) {
        if (!timed_out && mc_test_now() >= deadline) timed_out = 1;
        if (timed_out) {
            mc_test__kill_tree(pid);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
            break;
        }
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) break;
        if (done < 0 && errno != EINTR) {
            status = -1;
            break;
        }
        struct timespec nap = {0, 5 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    if (timed_out) {
        static const char msg[] = "\n[mc_test_run: timed out; the launch was killed]\n";
        mc_test__capture_add(&cap, msg, sizeof msg - 1);
    }
    mc_test__capture_finish(&cap);
    if (timed_out || status == -1) return -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

/* ---------------------------------------------------------------------------------------------
   mc_test_mpirun: runs `prog_and_args` on np ranks. The launcher prefix comes from MC_MPIRUN
   (exported by the Makefile) or defaults to "mpirun --oversubscribe", plus
   --allow-run-as-root when running as root. Shared-memory single-copy is turned off because
   containers usually forbid the ptrace-based CMA it uses. */
static inline int mc_test_mpirun(int np, const char *prog_and_args, double timeout_s, char *out,
                          size_t cap) {
    const char *launcher = getenv("MC_MPIRUN");
    char fallback[96];
    if (launcher == NULL || launcher[0] == '\0') {
        snprintf(fallback, sizeof fallback, "mpirun --oversubscribe%s",
                 geteuid() == 0 ? " --allow-run-as-root" : "");
        launcher = fallback;
    }
    size_t need = strlen(launcher) + strlen(prog_and_args) + 256;
    char *cmd = (char *)malloc(need);
    if (cmd == NULL) return -1;
    snprintf(cmd, need,
             "OMPI_MCA_btl_vader_single_copy_mechanism=none "
             "OMPI_MCA_rmaps_base_oversubscribe=1 "
             "OMPI_MCA_mpi_yield_when_idle=1 "
             "exec %s -np %d %s",
             launcher, np, prog_and_args);
    int rc = mc_test_run(cmd, timeout_s, out, cap);
    free(cmd);
    return rc;
}

/* Path of a program that sits next to the running test binary (build/tests/<name>), so
   the suites work from any working directory. Falls back to build/tests/<name>. */
/* The repository root: the nearest folder three or more levels above the running binary
   (<root>/build/tests/<binary>, <root>/build/asan/tests/<binary>) that holds megatron_c.h,
   else "." (a binary run from the root). */
static inline const char *mc_test_repo_root(void) {
    static char root[4096];
    if (root[0] != '\0') return root;
    snprintf(root, sizeof root, ".");
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        for (int up = 1; up <= 5; up++) {
            char *slash = strrchr(self, '/');
            if (slash == NULL) break;
            *slash = '\0';
            char probe[4096 + 16];
            snprintf(probe, sizeof probe, "%s/megatron_c.h", self);
            if (up >= 3 && access(probe, R_OK) == 0) {
                snprintf(root, sizeof root, "%s", self);
                break;
            }
        }
    }
    return root;
}

/* A fresh directory /tmp/mc_test_<name>_XXXXXX, its path in dir; 0, or -1 when it cannot be
   made (cap too small, mkdtemp failed). mc_test_remove_dir deletes it with everything in it. */
static inline int mc_test_make_tmpdir(char *dir, size_t cap, const char *name) {
    int n = snprintf(dir, cap, "/tmp/mc_test_%s_XXXXXX", name);
    return n > 0 && (size_t)n < cap && mkdtemp(dir) != NULL ? 0 : -1;
}

static inline void mc_test_remove_dir(const char *dir) {
    char cmd[4096 + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static inline const char *mc_test_sibling(const char *name, char *buf, size_t cap) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL) {
            *slash = '\0';
            int len = snprintf(buf, cap, "%s/%s", self, name);
            if (len > 0 && (size_t)len < cap && access(buf, X_OK) == 0) return buf;
        }
    }
    snprintf(buf, cap, "build/tests/%s", name);
    return buf;
}

/* Parses the last "N passed, N failed" line of a case program's output. Returns 1 and fills
   the counts when found, else 0. */
static inline int mc_test_summary(const char *out, int *passed, int *failed) {
    int found = 0;
    for (const char *line = out; line != NULL && *line != '\0';) {
        int p = 0, f = 0, used = 0;
        if (sscanf(line, "%d passed, %d failed%n", &p, &f, &used) == 2 && used > 0 &&
            (line[used] == '\n' || line[used] == '\0' || line[used] == '\r')) {
            *passed = p;
            *failed = f;
            found = 1;
        }
        const char *nl = strchr(line, '\n');
        line = nl != NULL ? nl + 1 : NULL;
    }
    return found;
}

/* ---------------------------------------------------------------------------------------------
   mc_test_allclose: element-wise |got - want| <= atol + |want| * rtol (llm.c's rule). Reports
   the number of mismatches, the largest difference and the first mismatch through cr_expect;
   returns the number of mismatches so a caller can stop early. */
#ifdef CRITERION_H_
static inline int mc_test_allclose(const float *got, const float *want, size_t n, float atol,
                            float rtol) {
    size_t bad = 0, first = 0;
    double max_diff = 0.0;
    size_t max_at = 0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - (double)want[i]);
        double tol = (double)atol + fabs((double)want[i]) * (double)rtol;
        if (diff > max_diff || isnan(diff)) {
            max_diff = diff;
            max_at = i;
        }
        if (!(diff <= tol)) {   /* written this way so a NaN counts as a mismatch */
            if (bad == 0) first = i;
            bad++;
        }
    }
    cr_expect(bad == 0,
              "allclose: %zu of %zu elements differ (atol %g, rtol %g); max |diff| %g at [%zu]; "
              "first mismatch [%zu]: got %.9g, want %.9g",
              bad, n, (double)atol, (double)rtol, max_diff, max_at, first,
              bad ? (double)got[first] : 0.0, bad ? (double)want[first] : 0.0);
    return (int)bad;
}
#endif

/* ---------------------------------------------------------------------------------------------
   MPI case programs (the programs under tests/mpi_cases). Every check is counted; a failed
   one prints a line naming the rank, the case, the source line and what went wrong.
   mc_case_finish sums the counts over the world; rank 0 prints "N passed, N failed" last. */
#ifdef MEGATRON_C_H_INCLUDED

typedef struct mc_case_state {
    const char *case_name;
    int world_rank;
    long long passed;
    long long failed;
} mc_case_state;

/* One per process: a case program runs one case. */
static inline mc_case_state *mc_case__state(void) {
    static mc_case_state state;
    return &state;
}

static inline void mc_case_begin(const char *case_name, int world_rank) {
    mc_case_state *st = mc_case__state();
    st->case_name = case_name;
    st->world_rank = world_rank;
    st->passed = 0;
    st->failed = 0;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline int mc_case_check_at(int ok, int line, const char *fmt, ...) {
    mc_case_state *st = mc_case__state();
    if (ok) {
        st->passed++;
        return 1;
    }
    st->failed++;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("[rank %d] FAIL %s (line %d): %s\n", st->world_rank,
           st->case_name ? st->case_name : "?", line, msg);
    fflush(stdout);
    return 0;
}
#define MC_CASE_CHECK(cond, ...) mc_case_check_at((cond) ? 1 : 0, __LINE__, __VA_ARGS__)

/* A status check that names both statuses and the library's last message. */
static inline int mc_case_check_status_at(int got, int want, int line, const char *what) {
    return mc_case_check_at(got == want, line, "%s returned %s, want %s (last error: %s)", what,
                            mc_err_name(got), mc_err_name(want), mc_last_error());
}
#define MC_CASE_CHECK_STATUS(got, want, what) \
    mc_case_check_status_at((got), (want), __LINE__, (what))

/* "[0,4,8]" - the member-list spelling of megatron_c's messages. */
static inline const char *mc_case_format_ranks(char *buf, size_t cap, const int *ranks, int n) {
    size_t len = 0;
    if (cap == 0) return buf;
    buf[0] = '\0';
    len += (size_t)snprintf(buf + len, cap - len, "[");
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, i ? ",%d" : "%d", ranks[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

/* Checks that `c` holds exactly `world_members` (world ranks, in member order): local fields
   first, then through the wire, by all-reducing the members' world ranks and all-gathering
   them. Only members call it; all of a group's members must call it together. */
/* A collective on host values (mc_host_collective stages them through the communicator's
   memory, device memory on nccl), so the case programs run unchanged on every backend. */
static inline int mc_case_collective_host(mc_comm *c, int gather, const void *send, void *recv,
                                          size_t count, mc_dtype dt) {
    return mc_host_collective(c, gather ? MC_COLL_ALL_GATHER : MC_COLL_ALL_REDUCE, send, recv,
                              count, dt, MC_SUM, 0);
}

static inline void mc_case_check_group(mc_comm *c, const int *world_members, int n,
                                       const char *label) {
    int my_world = mc_case__state()->world_rank;
    char want[512];
    mc_case_format_ranks(want, sizeof want, world_members, n);
    if (!MC_CASE_CHECK(c != NULL, "%s: no communicator, want members %s", label, want)) return;
    if (!MC_CASE_CHECK(c->size == n, "%s: size %d, want %d (members %s)", label, c->size, n,
                       want))
        return;
    int position = -1;
    for (int j = 0; j < n; j++) {
        if (world_members[j] == my_world) position = j;
        MC_CASE_CHECK(c->world_ranks[j] == world_members[j],
                      "%s: world_ranks[%d] = %d, want %d (members %s)", label, j,
                      c->world_ranks[j], world_members[j], want);
    }
    MC_CASE_CHECK(c->rank == position, "%s: rank %d, want %d (world rank %d in %s)", label,
                  c->rank, position, my_world, want);

    int64_t mine = my_world, sum = -1, want_sum = 0;
    for (int j = 0; j < n; j++) want_sum += world_members[j];
    int rc = mc_case_collective_host(c, 0, &mine, &sum, 1, MC_I64);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_all_reduce over the group"))
        MC_CASE_CHECK(sum == want_sum, "%s: all-reduce of world ranks = %lld, want %lld (%s)",
                      label, (long long)sum, (long long)want_sum, want);

    int32_t me32 = my_world;
    int32_t *gathered = (int32_t *)calloc((size_t)n, sizeof *gathered);
    if (gathered == NULL) return;
    rc = mc_case_collective_host(c, 1, &me32, gathered, 1, MC_I32);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_all_gather over the group")) {
        int same = 1;
        for (int j = 0; j < n; j++) same = same && gathered[j] == world_members[j];
        int got_ranks[64];
        int shown = n < 64 ? n : 64;
        for (int j = 0; j < shown; j++) got_ranks[j] = gathered[j];
        char got[512];
        mc_case_format_ranks(got, sizeof got, got_ranks, shown);
        MC_CASE_CHECK(same, "%s: all-gather of world ranks = %s, want %s", label, got, want);
    }
    free(gathered);
}

/* The value of a case program's --backend flag; returns 0 for an unknown name. */
static inline int mc_case_backend_option(const char *value, mc_comm_backend *out) {
    if (strcmp(value, "auto") == 0) *out = MC_BACKEND_AUTO;
    else if (strcmp(value, "self") == 0) *out = MC_BACKEND_SELF;
    else if (strcmp(value, "mpi") == 0) *out = MC_BACKEND_MPI;
    else if (strcmp(value, "nccl") == 0) *out = MC_BACKEND_NCCL;
    else return 0;
    return 1;
}

/* A case program's communication limit: `base_s` seconds times MC_CASE_TIME_SCALE (an
   environment variable, default 1; the sanitizer run raises it). Case programs use it as
   both the communicators' timeout and the watchdog (mc_comm_desc.watchdog_s), so a wrong
   schedule or a lost message ends every rank in seconds, with the watchdog naming each
   rank's call, instead of hanging until the test's limit. */
static inline double mc_case_time_s(double base_s) {
    const char *scale = getenv("MC_CASE_TIME_SCALE");
    double k = scale != NULL ? atof(scale) : 1.0;
    return base_s * (k > 0.0 ? k : 1.0);
}

/* mc_comm_init_world for a case program: on failure it prints the reason and the
   "0 passed, 1 failed" summary the test runner reads, and the caller exits with 1. */
static inline int mc_case_init_world(mc_comm **world, const mc_comm_desc *desc) {
    int rc = mc_comm_init_world(world, desc);
    if (rc != MC_OK)
        printf("mc_comm_init_world: %s: %s\n0 passed, 1 failed\n", mc_err_name(rc),
               mc_last_error());
    return rc;
}

/* Rank 0 prints the reason and the program exits 0: the case does not apply at this size. */
static inline int mc_case_skip(mc_comm *world, const char *reason) {
    if (world->rank == 0) printf("skipped: %s\n", reason);
    fflush(stdout);
    return 0;
}

/* Sums the counts over `world`; rank 0 prints "N passed, N failed". Returns the exit code:
   0 iff no rank failed a check. When the world can no longer reduce (a peer is gone), each
   rank judges its own counts and rank 0 prints those. */
static inline int mc_case_finish(mc_comm *world) {
    mc_case_state *st = mc_case__state();
    int64_t local[2] = {st->passed, st->failed}, total[2] = {0, 0};
    fflush(stdout);
    int rc = mc_case_collective_host(world, 0, local, total, 2, MC_I64);
    if (rc != MC_OK) {
        printf("[rank %d] could not sum the counts over the world (%s: %s); local counts\n",
               world->rank, mc_err_name(rc), mc_last_error());
        total[0] = local[0];
        total[1] = local[1];
    } else {
        mc_barrier(world);   /* let every rank's failure lines leave before the summary */
    }
    if (world->rank == 0) printf("%lld passed, %lld failed\n", (long long)total[0],
                                 (long long)total[1]);
    fflush(stdout);
    /* After a watchdog verdict the ranks exit without MPI_Finalize, and mpirun then ends the
       ones still running: the others give rank 0 a moment to print its summary first. */
    if (rc != MC_OK && world->rank != 0 && mc_comm_watchdog_verdict(world) != NULL) sleep(2);
    return total[1] == 0 ? 0 : 1;
}

/* A case program's last steps: start the case, run it (or, with skip_reason, skip it), print
   the summary, destroy the world; returns the exit code. */
static inline int mc_case_run(mc_comm *world, const char *name, void (*run)(void),
                              const char *skip_reason) {
    mc_case_begin(name, world->rank);
    int exit_code;
    if (skip_reason != NULL) {
        exit_code = mc_case_skip(world, skip_reason);
    } else {
        run();
        exit_code = mc_case_finish(world);
    }
    mc_comm_destroy(world);
    return exit_code;
}

#endif /* MEGATRON_C_H_INCLUDED */

/* ---------------------------------------------------------------------------------------------
   mc_test_read_file: the whole file, NUL-terminated (the caller frees it), its length in *len
   when len is not NULL; NULL when it cannot be opened or read. */
static inline char *mc_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *text = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? (char *)malloc((size_t)n + 1) : NULL;
    size_t got = text != NULL ? fread(text, 1, (size_t)n, f) : 0;
    fclose(f);
    if (text == NULL || got != (size_t)n) {
        free(text);
        return NULL;
    }
    text[got] = '\0';
    if (len != NULL) *len = got;
    return text;
}

/* ---------------------------------------------------------------------------------------------
   mc_test_json_at: the value at a dotted path of keys ("facts.probe.rank"), or NULL from the
   first key that is missing. Needs <cjson/cJSON.h> included before this file. */
#if defined(cJSON__h)
static inline cJSON *mc_test_json_at(const cJSON *obj, const char *dotted) {
    char path[512];
    snprintf(path, sizeof path, "%s", dotted);
    const cJSON *cur = obj;
    char *save = NULL;
    for (char *key = strtok_r(path, ".", &save); key != NULL && cur != NULL;
         key = strtok_r(NULL, ".", &save))
        cur = cJSON_GetObjectItemCaseSensitive(cur, key);
    return (cJSON *)cur;
}

/* The parsed JSON file (the caller deletes it), or NULL when it cannot be read or parsed. */
static inline cJSON *mc_test_json_load(const char *path) {
    char *text = mc_test_read_file(path, NULL);
    cJSON *doc = text != NULL ? cJSON_Parse(text) : NULL;
    free(text);
    return doc;
}
#endif /* cJSON__h */

/* ---------------------------------------------------------------------------------------------
   mc_test_lab_total: the score of a lab's grading table, from its last line "Total x/15"
   (the last such line in out), or -1 when there is none. */
static inline double mc_test_lab_total(const char *out) {
    const char *last = NULL;
    for (const char *p = out; p != NULL && (p = strstr(p, "\nTotal ")) != NULL; p++) last = p + 1;
    double v = -1.0;
    if (last == NULL || sscanf(last, "Total %lf/15", &v) != 1) return -1.0;
    return v;
}

#endif /* MC_TEST_UTIL_H_INCLUDED */
