/* staged_cases - the mpi backend with a device table: every collective through host copies.

       mpirun -np N build/tests/staged_cases all     (any machine: a pretend device)
       mpirun -np N build/tests/staged_cases cuda    (a CUDA build: the CUDA table, the ranks
                                                      sharing the node's GPUs)

   Ranks that share one GPU cannot form an NCCL communicator, so the mpi backend takes the
   CUDA table and stages each call: the send side is downloaded when it starts, the result
   uploaded when it finishes. No GPU is needed to check that path: the table here is the CPU
   table marked as a device whose memory holds every byte XOR-ed with a key that depends on
   the byte's address. Only upload and download (through the table) see the true values, so
   a collective that handed MPI the "device" pointer directly would reduce, gather or send
   scrambled bytes and fail the closed-form checks below. `cuda` runs the same checks on the
   real CUDA table (ranks sharing one GPU is what this path is for). Rank 0 ends with "N passed, N failed"; exit 0 iff every rank
   passed. Works for 1..8 ranks. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#define KEY 0xA5
#define COUNT 37   /* not a multiple of anything the MPI library might special-case */

static mc_comm *world;
static int me, np;
static mc_ops scrambled;              /* the pretend device table */
static int pretend;                   /* 1: `all` on the scrambled table, 0: `cuda` */
static long n_uploads, n_downloads;   /* calls through it */

/* The key of a device byte depends on its address, so raw bytes moved to another place
   (a gather's slot, a receive buffer) read back wrong too, not only reduced ones. */
static unsigned char key_at(const void *device_byte) {
    return (unsigned char)(KEY ^ ((uintptr_t)device_byte & 0xFF));
}

static int scrambled_upload(const mc_ops *o, void *dst, const void *host_src, size_t bytes) {
    (void)o;
    n_uploads++;
    const unsigned char *s = (const unsigned char *)host_src;
    unsigned char *d = (unsigned char *)dst;
    for (size_t i = 0; i < bytes; i++) d[i] = (unsigned char)(s[i] ^ key_at(d + i));
    return MC_OK;
}

static int scrambled_download(const mc_ops *o, void *host_dst, const void *src, size_t bytes) {
    (void)o;
    n_downloads++;
    const unsigned char *s = (const unsigned char *)src;
    unsigned char *d = (unsigned char *)host_dst;
    for (size_t i = 0; i < bytes; i++) d[i] = (unsigned char)(s[i] ^ key_at(s + i));
    return MC_OK;
}

/* A device buffer of n doubles holding host[0..n). */
static void *to_device(const double *host, size_t n) {
    void *d = mc_comm_alloc(world, n * sizeof(double));
    if (d != NULL) mc_comm_upload(world, d, host, n * sizeof(double));
    return d;
}

static void from_device(double *host, const void *dev, size_t n) {
    mc_comm_download(world, host, dev, n * sizeof(double));
}

/* Checks host[i] == want(i) for i < n; one failure line for the first mismatch. */
static void check_values(const char *what, const double *got, size_t n,
                         double (*want)(size_t i, int arg), int arg) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want(i, arg)) {
            MC_CASE_CHECK(0, "%s: element %zu is %g, want %g", what, i, got[i], want(i, arg));
            return;
        }
    MC_CASE_CHECK(1, "%s", what);
}

static double input_of(int rank, size_t i) { return (double)(rank + 1) * 1000.0 + (double)i; }
static double sum_at(size_t i, int arg) {
    (void)arg;
    return 1000.0 * np * (np + 1) / 2.0 + (double)np * (double)i;
}
static double avg_at(size_t i, int arg) { return sum_at(i, arg) / np; }
static double gathered_at(size_t i, int arg) {
    (void)arg;
    return input_of((int)(i / COUNT), i % COUNT);
}
static double scattered_at(size_t i, int rank) {   /* my block of the reduced [np * COUNT] */
    return sum_at((size_t)rank * COUNT + i, 0);
}
static double from_rank(size_t i, int rank) { return input_of(rank, i); }

static void all_reduce_cases(void) {
    double host[COUNT * 8], got[COUNT * 8];
    for (size_t i = 0; i < COUNT; i++) host[i] = input_of(me, i);
    void *send = to_device(host, COUNT), *recv = mc_comm_alloc(world, COUNT * sizeof(double));
    MC_CASE_CHECK_STATUS(mc_all_reduce(world, send, recv, COUNT, MC_F64, MC_SUM), MC_OK,
                         "all_reduce");
    from_device(got, recv, COUNT);
    check_values("all_reduce SUM, out of place", got, COUNT, sum_at, 0);
    MC_CASE_CHECK_STATUS(mc_all_reduce(world, send, send, COUNT, MC_F64, MC_AVG), MC_OK,
                         "all_reduce in place");
    from_device(got, send, COUNT);
    check_values("all_reduce AVG, in place (divided on the host copy)", got, COUNT, avg_at, 0);
    /* async: the result reaches the device only when the request finishes */
    mc_comm_upload(world, send, host, COUNT * sizeof(double));
    mc_request *req = NULL;
    MC_CASE_CHECK_STATUS(mc_all_reduce_async(world, send, recv, COUNT, MC_F64, MC_SUM, &req),
                         MC_OK, "all_reduce_async");
    MC_CASE_CHECK_STATUS(mc_wait(req), MC_OK, "mc_wait");
    from_device(got, recv, COUNT);
    check_values("all_reduce_async SUM after mc_wait", got, COUNT, sum_at, 0);
    mc_comm_free(world, send);
    mc_comm_free(world, recv);
}

static void gather_scatter_cases(void) {
    size_t all = (size_t)np * COUNT;
    double *host = malloc(all * sizeof(double)), *got = malloc(all * sizeof(double));
    for (size_t i = 0; i < COUNT; i++) host[i] = input_of(me, i);
    void *send = to_device(host, COUNT), *recv = mc_comm_alloc(world, all * sizeof(double));
    MC_CASE_CHECK_STATUS(mc_all_gather(world, send, recv, COUNT, MC_F64), MC_OK, "all_gather");
    from_device(got, recv, all);
    check_values("all_gather, out of place", got, all, gathered_at, 0);
    /* in place: this rank's slot of recv is the send buffer */
    void *whole = mc_comm_alloc(world, all * sizeof(double));
    char *own = (char *)whole + (size_t)me * COUNT * sizeof(double);
    mc_comm_upload(world, own, host, COUNT * sizeof(double));
    MC_CASE_CHECK_STATUS(mc_all_gather(world, own, whole, COUNT, MC_F64), MC_OK,
                         "all_gather in place");
    from_device(got, whole, all);
    check_values("all_gather, in place", got, all, gathered_at, 0);
    /* reduce-scatter of [np * COUNT] inputs: block r of the sum lands on rank r */
    for (size_t i = 0; i < all; i++) host[i] = input_of(me, i);
    mc_comm_upload(world, whole, host, all * sizeof(double));
    MC_CASE_CHECK_STATUS(mc_reduce_scatter(world, whole, recv, COUNT, MC_F64, MC_SUM), MC_OK,
                         "reduce_scatter");
    from_device(got, recv, COUNT);
    check_values("reduce_scatter SUM: this rank's block", got, COUNT, scattered_at, me);
    mc_comm_free(world, send);
    mc_comm_free(world, recv);
    mc_comm_free(world, whole);
    free(host);
    free(got);
}

static void broadcast_and_p2p_cases(void) {
    double host[COUNT], got[COUNT];
    int root = np - 1;
    for (size_t i = 0; i < COUNT; i++) host[i] = input_of(me, i);
    void *buf = to_device(host, COUNT);
    MC_CASE_CHECK_STATUS(mc_broadcast(world, buf, COUNT, MC_F64, root), MC_OK, "broadcast");
    from_device(got, buf, COUNT);
    check_values("broadcast from the last rank", got, COUNT, from_rank, root);
    /* ring: send mine to the next rank, receive the previous rank's (itself at np = 1) */
    int next = (me + 1) % np, prev = (me + np - 1) % np;
    mc_comm_upload(world, buf, host, COUNT * sizeof(double));
    void *in = mc_comm_alloc(world, COUNT * sizeof(double));
    mc_p2p_op ops[2] = {{1, buf, COUNT, MC_F64, next, 7}, {0, in, COUNT, MC_F64, prev, 7}};
    MC_CASE_CHECK_STATUS(mc_batch_send_recv(world, ops, 2), MC_OK, "batch_send_recv");
    from_device(got, in, COUNT);
    check_values("batch send/recv around the ring: the previous rank's values", got, COUNT,
                 from_rank, prev);
    mc_comm_free(world, buf);
    mc_comm_free(world, in);
}

/* Host values through mc_host_collective: MPI reads host memory, so they go to it as they are,
   with no copy through the device table (on the pretend device a copy would also be counted). */
static void host_collective_case(void) {
    int64_t mine[2] = {me, 1}, all[2] = {0, 0}, gathered[2 * 64] = {0}, word = me == 0 ? 42 : -1;
    long up = n_uploads, down = n_downloads;
    MC_CASE_CHECK_STATUS(mc_host_collective(world, MC_COLL_ALL_REDUCE, mine, all, 2, MC_I64,
                                            MC_SUM, 0),
                         MC_OK, "mc_host_collective");
    MC_CASE_CHECK(all[0] == (int64_t)np * (np - 1) / 2 && all[1] == np,
                  "mc_host_collective SUM of (rank, 1): got (%lld, %lld), want (%d, %d)",
                  (long long)all[0], (long long)all[1], np * (np - 1) / 2, np);
    if (np <= 64) {
        MC_CASE_CHECK_STATUS(mc_host_collective(world, MC_COLL_ALL_GATHER, mine, gathered, 2,
                                                MC_I64, MC_SUM, 0),
                             MC_OK, "mc_host_collective all-gather");
        int ok = 1;
        for (int r = 0; r < np; r++)
            ok = ok && gathered[2 * r] == r && gathered[2 * r + 1] == 1;
        MC_CASE_CHECK(ok, "mc_host_collective all-gather of (rank, 1): rank order");
    }
    MC_CASE_CHECK_STATUS(mc_host_collective(world, MC_COLL_BROADCAST, &word, &word, 1, MC_I64,
                                            MC_SUM, 0),
                         MC_OK, "mc_host_collective broadcast");
    MC_CASE_CHECK(word == 42, "mc_host_collective broadcast from rank 0: got %lld, want 42",
                  (long long)word);
    if (pretend)
        MC_CASE_CHECK(n_uploads == up && n_downloads == down,
                      "mc_host_collective copied through the device table (%ld uploads, %ld "
                      "downloads): host values go to MPI as they are",
                      n_uploads - up, n_downloads - down);
}

static void case_all(void) {
    if (pretend) {   /* the control: the table really scrambles, so a direct read is wrong */
        double v = 1.0, raw = 0.0;
        void *d = to_device(&v, 1);
        memcpy(&raw, d, sizeof raw);
        MC_CASE_CHECK(raw != v, "the pretend device memory holds scrambled bytes");
        mc_comm_free(world, d);
    }
    all_reduce_cases();
    gather_scatter_cases();
    broadcast_and_p2p_cases();
    host_collective_case();
    long up = n_uploads, down = n_downloads;
    if (pretend)
        MC_CASE_CHECK(up > 0 && down > 0, "the collectives went through the table (%ld "
                      "uploads, %ld downloads)", up, down);
    mc_backend_info info;
    MC_CASE_CHECK_STATUS(mc_backend_query(world, &info), MC_OK, "mc_backend_query");
    MC_CASE_CHECK(strcmp(info.device_kind, "cuda") == 0 && strcmp(info.backend, "mpi") == 0,
                  "backend '%s', device kind '%s': want mpi with the device table", info.backend,
                  info.device_kind);
}

/* The CUDA table on GPU (local rank mod visible GPUs); 0 when it cannot be made. */
static int cuda_table(mc_ops *t) {
#if defined(MC_ENABLE_CUDA)
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    int n = mc_cuda_device_count();
    if (n == 0) return 0;
    if (mc_ops_cuda_init(t, &(mc_cuda_desc){.device = (lr ? atoi(lr) : 0) % n}) != MC_OK) {
        printf("mc_ops_cuda_init: %s\n0 passed, 1 failed\n", mc_last_error());
        exit(1);
    }
    return 1;
#else
    (void)t;
    return 0;
#endif
}

int main(int argc, char **argv) {
    int use_cuda = argc == 2 && strcmp(argv[1], "cuda") == 0;
    if (argc != 2 || (!use_cuda && strcmp(argv[1], "all") != 0)) {
        fprintf(stderr, "usage: mpirun -np N %s all|cuda\n", argv[0]);
        return 2;
    }
    mc_ops device;
    pretend = !use_cuda;
    if (use_cuda && !cuda_table(&device)) {
        printf("skipped: no CUDA table in this build or no GPU visible\n");
        return 0;
    }
    scrambled = *mc_ops_cpu();
    scrambled.name = "scrambled";
    scrambled.device = MC_DEVICE_CUDA;
    scrambled.upload = scrambled_upload;
    scrambled.download = scrambled_download;
    int rc = mc_case_init_world(&world, &(mc_comm_desc){.backend = MC_BACKEND_MPI,
                                                         .timeout_s = 20.0,
                                                         .memory = pretend ? &scrambled : &device,
                                                         .argc = &argc, .argv = &argv});
    if (rc != MC_OK) return 1;
    me = world->rank;
    np = world->size;
    rc = mc_case_run(world, argv[1], case_all, NULL);
#if defined(MC_ENABLE_CUDA)
    if (use_cuda) mc_ops_cuda_destroy(&device);
#endif
    return rc;
}
