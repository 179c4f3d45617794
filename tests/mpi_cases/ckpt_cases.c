/* ckpt_cases - multi-rank checks of megatron_c's checkpoints (save in global form, load under
   another layout).

       mpirun -np N build/tests/ckpt_cases <case> --dir DIR [--tp T] [--pp P] [--vpp V]
                                           [--layers L] [--vocab V] [--iter N] [--explicit]
                                           [--no-optim] [--library-table]
                                           [--saved-tp T --saved-pp P --saved-dp D]

   DP is N / (TP * PP). The model is the synthetic GPT-shaped table of tests/ckpt_model.h, with
   offsets from mc_param_table_layout under --library-table.
   Cases:
     save       fills params, exp_avg, exp_avg_sq with the global values of the layout, seeds
                the RNG tracker Megatron's way and advances it per rank, saves iteration N
                (consumed samples 32 N, optimizer step N); rank 0 then checks the directory
                (iter_NNNNNNN/metadata.txt, no .tmp left, latest = N).
     load       loads `latest` (--explicit: iteration N) into zeroed buffers; every element of
                every local shard must equal the slice of the global tensors (vocabulary rows
                past the saved padded vocabulary are 0), padding untouched; the scalars; the
                RNG states restored when TP and PP are those saved (--saved-tp/--saved-pp),
                else reset to the start-of-training seeding.
     math       a load with layernorm_epsilon changed is refused on every rank with a message
                naming the field; with MC_CKPT_LOAD_IGNORE_MATH it loads.
     corrupt    saves iteration 5 itself, then: truncated tensor file, a flipped byte, missing,
                truncated and corrupted metadata, a stale .tmp directory of an interrupted save,
                an unreadable `latest`, explicit iterations, a checkpoint without optimizer
                state, a parameter the checkpoint lacks. Every error must reach every rank with
                the same message.
     bad_table  (TP 2) ranks that disagree on the iteration, a tensor half written (a shard
                wrongly marked shared), an invalid name on one rank: every rank fails alike.
   Rank 0 ends with "N passed, N failed"; the exit status is 0 iff every rank passed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "megatron_c.h"
#include "tests/test_util.h"
#include "tests/ckpt_model.h"

#define TIMEOUT_S mc_case_time_s(20.0)   /* also the watchdog */

typedef struct options {
    const char *dir;
    int tp, pp, vpp, layers, vocab;
    long long iter;
    int explicit_iter, no_optim, library_table;
    int saved_tp, saved_pp, saved_dp;
} options;

static mc_comm *world;
static int me, np;
static options opt;
static mc_parallel_state ps;
static ckpt_layout layout;

/* ---------------------------------------------------------------------------------------------
   helpers */

static int setup_parallel(int tp, int pp, int vpp) {
    mc_parallel_desc d;
    memset(&d, 0, sizeof d);
    memset(&ps, 0, sizeof ps);
    d.world = world;
    d.grid.tp = tp;
    d.grid.pp = pp;
    d.grid.vpp = vpp;
    int rc = mc_parallel_init(&ps, &d);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_parallel_init")) return 0;
    memset(&layout, 0, sizeof layout);
    layout.tp = tp;
    layout.pp = pp;
    layout.vpp = vpp;
    layout.tp_rank = ps.coords.tp;
    layout.pp_rank = ps.coords.pp;
    layout.layers = opt.layers;
    layout.vocab = opt.vocab;
    layout.library_table = opt.library_table;
    layout.dp = ps.grid.dp;
    return 1;
}

/* Megatron's seeding of this rank (as the GPT model seeds at start), then (advance) some draws
   that depend on the position, so that the states of different ranks and of a fresh start all
   differ. */
static void rng_state(mc_rng_tracker *t, int tp_rank, int pp_rank, int advance) {
    float u[32];
    memset(t, 0, sizeof *t);
    mc_rng_tracker_seed_megatron(t, 1234, tp_rank, pp_rank, ps.coords.ep, ps.coords.etp, 0, 0);
    if (!advance) return;
    mc_rng_tracker_fork(t, MC_RNG_MODEL_PARALLEL);
    mc_rng_uniform(mc_rng_tracker_current(t), u, (size_t)(3 + tp_rank + 2 * pp_rank));
    mc_rng_tracker_unfork(t, MC_RNG_MODEL_PARALLEL);
    mc_rng_uniform(mc_rng_tracker_current(t), u, 5);
}

static int rng_equal(const mc_rng_tracker *a, const mc_rng_tracker *b) {
    mc_rng_states x, y;
    mc_rng_tracker_get_states(a, &x);
    mc_rng_tracker_get_states(b, &y);
    if (x.current.seed != y.current.seed || x.current.offset != y.current.offset) return 0;
    if (x.n_streams != y.n_streams) return 0;
    for (int i = 0; i < x.n_streams; i++)
        if (strcmp(x.names[i], y.names[i]) != 0 || x.streams[i].seed != y.streams[i].seed ||
            x.streams[i].offset != y.streams[i].offset)
            return 0;
    return 1;
}

static mc_checkpoint_desc make_desc(ckpt_model *m, mc_rng_tracker *rng, long long iter,
                                    int with_optim) {
    mc_checkpoint_desc d;
    memset(&d, 0, sizeof d);
    d.dir = opt.dir;
    d.ps = &ps;
    d.config = &m->cfg;
    d.params = &m->table;
    d.param_data = m->data[0];
    d.exp_avg = with_optim ? m->data[1] : NULL;
    d.exp_avg_sq = with_optim ? m->data[2] : NULL;
    d.rng = rng;
    d.iteration = iter;
    d.consumed_samples = 32 * iter;
    d.optimizer_step = iter;
    return d;
}

/* Every rank must fail with `want`, a message holding `needle`, the same message everywhere. */
static void expect_fail(int rc, int want, const char *needle, const char *what) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mc_last_error());
    MC_CASE_CHECK(rc == want, "%s: returned %s, want %s (%s)", what, mc_err_name(rc),
                  mc_err_name(want), msg);
    MC_CASE_CHECK(strstr(msg, needle) != NULL, "%s: the message lacks \"%s\": %s", what, needle,
                  msg);
    int64_t h = (int64_t)mc_crc32(0, msg, strlen(msg)), lo = 0, hi = 0;
    mc_all_reduce(world, &h, &lo, 1, MC_I64, MC_MIN);
    mc_all_reduce(world, &h, &hi, 1, MC_I64, MC_MAX);
    MC_CASE_CHECK(lo == hi, "%s: the ranks report different messages (this one: %s)", what, msg);
    if (me == 0) printf("  %s -> %s: %s\n", what, mc_err_name(rc), msg);
    fflush(stdout);
}

static void check_values(ckpt_model *m, int buffers, long long stored_rows, const char *what) {
    char why[512];
    for (int k = 0; k < buffers; k++) {
        long long bad = ckpt_model_compare(m, &layout, k, stored_rows, why, sizeof why);
        MC_CASE_CHECK(bad == 0, "%s: %lld elements differ; first: %s", what, bad, why);
    }
}

/* File surgery, done by rank 0 between barriers. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = (char *)malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int spit(const char *path, const char *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = fwrite(buf, 1, len, f);
    fclose(f);
    return w == len;
}

static void path_in(char *out, size_t cap, const char *iter_dir, const char *file) {
    snprintf(out, cap, "%s/%s", iter_dir, file);
}

/* ---------------------------------------------------------------------------------------------
   save / load */

static void case_save(void) {
    if (!setup_parallel(opt.tp, opt.pp, opt.vpp)) return;
    ckpt_model m;
    mc_rng_tracker rng;
    if (!MC_CASE_CHECK(ckpt_model_init(&m, &layout, NAN) == 0, "model init")) return;
    rng_state(&rng, layout.tp_rank, layout.pp_rank, 1);
    mc_checkpoint_desc d = make_desc(&m, &rng, opt.iter, !opt.no_optim);
    int rc = mc_checkpoint_save(&d);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_checkpoint_save");
    /* the save must not change what it saved */
    check_values(&m, opt.no_optim ? 1 : 3, -1, "after save");
    if (me == 0 && rc == MC_OK) {
        char dir[1024], path[1200];
        long long latest = -5;
        mc_checkpoint_iteration_dir(dir, sizeof dir, opt.dir, opt.iter);
        path_in(path, sizeof path, dir, MC_CKPT_METADATA_FILE);
        MC_CASE_CHECK(access(path, R_OK) == 0, "%s missing", path);
        snprintf(path, sizeof path, "%s.tmp", dir);
        MC_CASE_CHECK(access(path, F_OK) != 0, "%s still there after the save", path);
        MC_CASE_CHECK_STATUS(mc_checkpoint_latest(opt.dir, &latest), MC_OK, "mc_checkpoint_latest");
        MC_CASE_CHECK(latest == opt.iter, "latest = %lld, want %lld", latest, opt.iter);
        /* the tied copy is not written; the word embedding is, once */
        path_in(path, sizeof path, dir, "model.output_layer.weight.bin");
        MC_CASE_CHECK(access(path, F_OK) != 0, "the tied copy was written: %s", path);
        path_in(path, sizeof path, dir, "model.embedding.word_embeddings.weight.bin");
        MC_CASE_CHECK(access(path, R_OK) == 0, "%s missing", path);
        mc_checkpoint_meta meta;
        size_t len = 0;
        path_in(path, sizeof path, dir, MC_CKPT_METADATA_FILE);
        char *text = slurp(path, &len);
        rc = text ? mc_checkpoint_parse_metadata(&meta, text, len, path, NULL) : MC_ERR_IO;
        if (MC_CASE_CHECK_STATUS(rc, MC_OK, "parse metadata")) {
            int per_kind = 4 + 12 * opt.layers;   /* embeddings, final norm, layers */
            int want = per_kind * (opt.no_optim ? 1 : 3);
            MC_CASE_CHECK(meta.n_tensors == want, "metadata lists %d tensors, want %d",
                          meta.n_tensors, want);
            MC_CASE_CHECK(meta.n_rng == opt.tp * opt.pp, "%d rng files, want %d", meta.n_rng,
                          opt.tp * opt.pp);
            MC_CASE_CHECK(meta.tp == opt.tp && meta.pp == opt.pp && meta.dp == np / (opt.tp * opt.pp)
                          && meta.vpp == opt.vpp && meta.world == np,
                          "layout tp %d pp %d dp %d vpp %d world %d", meta.tp, meta.pp, meta.dp,
                          meta.vpp, meta.world);
            MC_CASE_CHECK(meta.config.layernorm_epsilon == m.cfg.layernorm_epsilon &&
                          meta.config.num_layers == opt.layers,
                          "config read back: eps %g layers %d",
                          (double)meta.config.layernorm_epsilon, meta.config.num_layers);
            const mc_checkpoint_tensor *t =
                mc_checkpoint_meta_find(&meta, "model", "decoder.layers.0.mlp.linear_fc1.weight");
            MC_CASE_CHECK(t && t->ndim == 2 && t->shape[0] == CKPT_FFN && t->shape[1] == CKPT_H,
                          "fc1 weight listed with its global shape");
        }
        mc_checkpoint_meta_destroy(&meta);
        free(text);
    }
    ckpt_model_free(&m);
    mc_parallel_destroy(&ps);
}

static void case_load(void) {
    if (!setup_parallel(opt.tp, opt.pp, opt.vpp)) return;
    ckpt_model m;
    mc_rng_tracker rng, want_rng;
    mc_checkpoint_result res;
    float u[4];
    if (!MC_CASE_CHECK(ckpt_model_init(&m, &layout, 0.0f) == 0, "model init")) return;
    rng_state(&rng, layout.tp_rank, layout.pp_rank, 0);
    mc_rng_uniform(mc_rng_tracker_current(&rng), u, 4);   /* neither the saved nor the reset state */
    mc_checkpoint_desc d = make_desc(&m, &rng, opt.iter, !opt.no_optim);
    int rc = mc_checkpoint_load(&d, opt.explicit_iter ? MC_CKPT_LOAD_ITERATION : 0, &res);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_checkpoint_load")) goto out;
    long long stored_rows = opt.saved_tp > 0 ? ckpt_padded_vocab(opt.vocab, opt.saved_tp) : -1;
    check_values(&m, opt.no_optim ? 1 : 3, stored_rows, "loaded shards");
    MC_CASE_CHECK(res.iteration == opt.iter && res.consumed_samples == 32 * opt.iter &&
                  res.optimizer_step == opt.iter,
                  "scalars: iteration %lld consumed %lld step %lld, want %lld %lld %lld",
                  res.iteration, res.consumed_samples, res.optimizer_step, opt.iter,
                  32 * opt.iter, opt.iter);
    MC_CASE_CHECK(res.optimizer_loaded == !opt.no_optim, "optimizer_loaded %d",
                  res.optimizer_loaded);
    if (opt.saved_tp > 0) {
        int same = opt.saved_tp == opt.tp && opt.saved_pp == opt.pp;
        int dp = np / (opt.tp * opt.pp);
        MC_CASE_CHECK(res.saved_tp == opt.saved_tp && res.saved_pp == opt.saved_pp &&
                      res.saved_dp == opt.saved_dp,
                      "saved layout TP %d PP %d DP %d, want %d %d %d", res.saved_tp, res.saved_pp,
                      res.saved_dp, opt.saved_tp, opt.saved_pp, opt.saved_dp);
        MC_CASE_CHECK(res.resharded == !(same && opt.saved_dp == dp && res.saved_vpp == opt.vpp),
                      "resharded = %d", res.resharded);
        MC_CASE_CHECK(res.rng_restored == same, "rng_restored = %d, want %d (note: %s)",
                      res.rng_restored, same, res.note);
        rng_state(&want_rng, layout.tp_rank, layout.pp_rank, same);
        MC_CASE_CHECK(rng_equal(&rng, &want_rng), "RNG states are not the %s ones",
                      same ? "saved" : "start-of-training");
        if (!same)
            MC_CASE_CHECK(strstr(res.note, "RNG states reset") != NULL, "note: %s", res.note);
    }
    if (me == 0)
        printf("  loaded %s: saved TP %d PP %d DP %d VPP %d -> TP %d PP %d VPP %d; %s\n",
               res.path, res.saved_tp, res.saved_pp, res.saved_dp, res.saved_vpp, opt.tp, opt.pp,
               opt.vpp, res.rng_restored ? "RNG restored" : res.note);
out:
    ckpt_model_free(&m);
    mc_parallel_destroy(&ps);
}

static void case_math(void) {
    if (!setup_parallel(opt.tp, opt.pp, opt.vpp)) return;
    ckpt_model m;
    mc_checkpoint_result res;
    if (!MC_CASE_CHECK(ckpt_model_init(&m, &layout, 0.0f) == 0, "model init")) return;
    m.cfg.layernorm_epsilon = 1e-6f;
    mc_checkpoint_desc d = make_desc(&m, NULL, 0, 0);
    int rc = mc_checkpoint_load(&d, 0, &res);
    expect_fail(rc, MC_ERR_INVALID_DESC, "layernorm_epsilon", "eps changed");
    MC_CASE_CHECK(m.data[0][m.table.info[0].offset] == 0.0f, "a refused load wrote parameters");
    rc = mc_checkpoint_load(&d, MC_CKPT_LOAD_IGNORE_MATH, &res);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "load with MC_CKPT_LOAD_IGNORE_MATH");
    MC_CASE_CHECK(res.math_mismatch_ignored == 1, "math_mismatch_ignored = %d",
                  res.math_mismatch_ignored);
    check_values(&m, 1, -1, "loaded despite the mismatch");
    ckpt_model_free(&m);
    mc_parallel_destroy(&ps);
}

/* ---------------------------------------------------------------------------------------------
   corrupt */

static int load_into(ckpt_model *m, unsigned flags, long long iter, int with_optim,
                     mc_checkpoint_result *res) {
    mc_checkpoint_desc d = make_desc(m, NULL, iter, with_optim);
    return mc_checkpoint_load(&d, flags, res);
}

static void case_corrupt(void) {
    if (!setup_parallel(opt.tp, 1, 0)) return;
    layout.library_table = 0;   /* the case edits the table in place */
    ckpt_model src, m;
    mc_checkpoint_result res;
    mc_rng_tracker rng;
    char dir5[1024], dir6[1024], path[1600], keep[1700];
    const char *victim = "model.decoder.layers.0.mlp.linear_fc1.weight.bin";
    if (!MC_CASE_CHECK(ckpt_model_init(&src, &layout, NAN) == 0, "model init")) return;
    if (!MC_CASE_CHECK(ckpt_model_init(&m, &layout, 0.0f) == 0, "model init")) return;
    rng_state(&rng, layout.tp_rank, 0, 1);
    mc_checkpoint_desc d = make_desc(&src, &rng, 5, 1);
    int rc = mc_checkpoint_save(&d);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "save iteration 5")) return;
    mc_checkpoint_iteration_dir(dir5, sizeof dir5, opt.dir, 5);
    mc_checkpoint_iteration_dir(dir6, sizeof dir6, opt.dir, 6);
    rc = load_into(&m, 0, 0, 1, &res);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "baseline load");
    check_values(&m, 3, -1, "baseline load");

    /* 1. a truncated tensor file */
    size_t len = 0;
    char *orig = NULL;
    path_in(path, sizeof path, dir5, victim);
    if (me == 0) {
        orig = slurp(path, &len);
        MC_CASE_CHECK(orig != NULL && spit(path, orig, len - 10), "truncate %s", path);
    }
    mc_barrier(world);
    rc = load_into(&m, 0, 0, 1, &res);
    expect_fail(rc, MC_ERR_IO, "truncated", "truncated tensor file");
    MC_CASE_CHECK(strstr(mc_last_error(), victim) != NULL, "the message names the file: %s",
                  mc_last_error());

    /* 2. one flipped byte in the data */
    if (me == 0) {
        char *bad = (char *)malloc(len);
        memcpy(bad, orig, len);
        bad[MC_CKPT_HEADER_BYTES + 100] ^= 0x10;
        MC_CASE_CHECK(spit(path, bad, len), "flip a byte of %s", path);
        free(bad);
    }
    mc_barrier(world);
    rc = load_into(&m, 0, 0, 1, &res);
    expect_fail(rc, MC_ERR_IO, "corrupted", "flipped byte in a tensor file");
    MC_CASE_CHECK(strstr(mc_last_error(), victim) != NULL, "the message names the file: %s",
                  mc_last_error());
    if (me == 0) MC_CASE_CHECK(spit(path, orig, len), "restore %s", path);
    free(orig);
    mc_barrier(world);
    rc = load_into(&m, 0, 0, 1, &res);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "load after restoring the file");

    /* 3. metadata: missing, truncated, corrupted */
    path_in(path, sizeof path, dir5, MC_CKPT_METADATA_FILE);
    snprintf(keep, sizeof keep, "%s.away", path);
    if (me == 0) MC_CASE_CHECK(rename(path, keep) == 0, "move metadata away");
    mc_barrier(world);
    rc = load_into(&m, 0, 0, 1, &res);
    expect_fail(rc, MC_ERR_IO, "has no metadata.txt", "missing metadata");
    if (me == 0) {
        MC_CASE_CHECK(rename(keep, path) == 0, "move metadata back");
        orig = slurp(path, &len);
        MC_CASE_CHECK(orig && spit(path, orig, len / 2), "truncate metadata");
    }
    mc_barrier(world);
    rc = load_into(&m, 0, 0, 1, &res);
    expect_fail(rc, MC_ERR_IO, "truncated", "truncated metadata");
    if (me == 0) {
        char *bad = (char *)malloc(len);
        memcpy(bad, orig, len);
        char *hit = strstr(bad, "config hidden_size 16");
        MC_CASE_CHECK(hit != NULL, "metadata holds the config line");
        if (hit) hit[strlen("config hidden_size 1")] = '8';
        MC_CASE_CHECK(spit(path, bad, len), "corrupt metadata");
        free(bad);
    }
    mc_barrier(world);
    rc = load_into(&m, 0, 0, 1, &res);
    expect_fail(rc, MC_ERR_IO, "metadata.txt is corrupted", "edited metadata");
    if (me == 0) MC_CASE_CHECK(spit(path, orig, len), "restore metadata");
    free(orig);
    orig = NULL;

    /* 4. an interrupted save of iteration 6 left iter_0000006.tmp: ignored, then replaced */
    if (me == 0) {
        snprintf(path, sizeof path, "%s.tmp", dir6);
        MC_CASE_CHECK(mkdir(path, 0755) == 0, "make %s", path);
        path_in(keep, sizeof keep, path, victim);
        MC_CASE_CHECK(spit(keep, "partial", 7), "a partial file in the .tmp directory");
    }
    mc_barrier(world);
    memset(&res, 0, sizeof res);
    rc = load_into(&m, 0, 0, 1, &res);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "load next to an interrupted save");
    MC_CASE_CHECK(res.iteration == 5, "loaded iteration %lld, want 5", res.iteration);
    check_values(&m, 3, -1, "load next to an interrupted save");
    d.iteration = 6;
    rc = mc_checkpoint_save(&d);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "save iteration 6 over the stale .tmp");
    rc = load_into(&m, 0, 0, 1, &res);
    MC_CASE_CHECK(rc == MC_OK && res.iteration == 6, "latest is now 6 (rc %s, iteration %lld)",
                  mc_err_name(rc), res.iteration);

    /* 5. explicit iterations, an unreadable `latest` */
    rc = load_into(&m, MC_CKPT_LOAD_ITERATION, 5, 1, &res);
    MC_CASE_CHECK(rc == MC_OK && res.iteration == 5, "explicit iteration 5 (rc %s, got %lld)",
                  mc_err_name(rc), res.iteration);
    rc = load_into(&m, MC_CKPT_LOAD_ITERATION, 7, 1, &res);
    expect_fail(rc, MC_ERR_IO, "iter_0000007 does not exist", "missing iteration");
    path_in(path, sizeof path, opt.dir, MC_CKPT_LATEST_FILE);
    if (me == 0) MC_CASE_CHECK(spit(path, "six\n", 4), "garble latest");
    mc_barrier(world);
    rc = load_into(&m, 0, 0, 1, &res);
    expect_fail(rc, MC_ERR_IO, "not an iteration number", "garbled latest");
    if (me == 0) MC_CASE_CHECK(spit(path, "6\n", 2), "restore latest");
    mc_barrier(world);

    /* 6. a checkpoint without optimizer state; a parameter the checkpoint lacks */
    d.iteration = 7;
    d.exp_avg = d.exp_avg_sq = NULL;
    rc = mc_checkpoint_save(&d);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "save iteration 7 without optimizer state");
    rc = load_into(&m, 0, 0, 1, &res);
    expect_fail(rc, MC_ERR_IO, "exp_avg", "optimizer state asked, not saved");
    rc = load_into(&m, 0, 0, 0, &res);
    MC_CASE_CHECK(rc == MC_OK && res.optimizer_loaded == 0, "model-only load (rc %s)",
                  mc_err_name(rc));
    {
        mc_param_info *extra = &m.table.info[m.table.count];   /* capacity has room */
        *extra = m.table.info[m.table.count - 1];
        snprintf(extra->name, sizeof extra->name, "decoder.layers.99.extra.weight");
        m.table.count++;
        rc = load_into(&m, 0, 0, 0, &res);
        expect_fail(rc, MC_ERR_IO, "has no tensor decoder.layers.99.extra.weight",
                    "a parameter the checkpoint lacks");
        m.table.count--;
    }
    /* a shape change without a config change (needs the override to get that far) */
    {
        mc_param_info *p = &m.table.info[m.table.count - 1];   /* a replicated 1-D bias */
        int keep_shape = p->global_shape[0];
        p->global_shape[0] = p->local_shape[0] = keep_shape / 2;
        p->numel = (size_t)p->local_shape[0];
        rc = load_into(&m, 0, 0, 0, &res);
        expect_fail(rc, MC_ERR_INVALID_DESC,
                    "has shape [16] in the checkpoint, but parameter decoder.final_layernorm.bias "
                    "of the current model has global shape [8]", "shape changed");
        p->global_shape[0] = p->local_shape[0] = keep_shape;
        p->numel = (size_t)keep_shape;
    }
    ckpt_model_free(&src);
    ckpt_model_free(&m);
    mc_parallel_destroy(&ps);
}

/* ---------------------------------------------------------------------------------------------
   bad_table */

static void case_bad_table(void) {
    if (!setup_parallel(2, 1, 0)) return;
    layout.library_table = 0;   /* the case edits the table in place */
    ckpt_model m;
    if (!MC_CASE_CHECK(ckpt_model_init(&m, &layout, NAN) == 0, "model init")) return;
    mc_checkpoint_desc d = make_desc(&m, NULL, 3, 0);

    if (me == np - 1) d.iteration = 4;
    int rc = mc_checkpoint_save(&d);
    expect_fail(rc, MC_ERR_INVALID_ARG, "ranks disagree on iteration", "iteration differs");
    d.iteration = 3;

    int qkv = ckpt_find(&m.table, "decoder.layers.0.self_attention.linear_qkv.weight");
    MC_CASE_CHECK(qkv >= 0, "qkv weight in the table");
    if (layout.tp_rank == 1 && qkv >= 0) m.table.info[qkv].shared = 1;
    rc = mc_checkpoint_save(&d);
    expect_fail(rc, MC_ERR_INVALID_DESC, "wrote 384 of its 768 elements", "half-written tensor");
    if (qkv >= 0) m.table.info[qkv].shared = 0;

    char dir[1024], tmp[1100];
    mc_checkpoint_iteration_dir(dir, sizeof dir, opt.dir, 3);
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    MC_CASE_CHECK(access(tmp, F_OK) != 0 && access(dir, F_OK) != 0,
                  "a failed save left %s or %s", tmp, dir);

    char keep[MC_PARAM_NAME_MAX];
    snprintf(keep, sizeof keep, "%s", m.table.info[0].name);
    if (me == 0) snprintf(m.table.info[0].name, sizeof m.table.info[0].name, "../escape");
    rc = mc_checkpoint_save(&d);
    expect_fail(rc, MC_ERR_INVALID_DESC, "names a file", "a parameter name with '/'");
    snprintf(m.table.info[0].name, sizeof m.table.info[0].name, "%s", keep);

    rc = mc_checkpoint_save(&d);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "the repaired table saves");
    ckpt_model_free(&m);
    mc_parallel_destroy(&ps);
}

/* ---------------------------------------------------------------------------------------------
   main */

typedef struct ckpt_case {
    const char *name;
    void (*run)(void);
} ckpt_case;

static const ckpt_case cases[] = {
    {"save", case_save}, {"load", case_load}, {"math", case_math},
    {"corrupt", case_corrupt}, {"bad_table", case_bad_table},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static int parse_options(int argc, char **argv) {
    memset(&opt, 0, sizeof opt);
    opt.tp = opt.pp = 1;
    opt.layers = 4;
    opt.vocab = 64;
    opt.iter = 10;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--explicit") == 0) opt.explicit_iter = 1;
        else if (strcmp(a, "--no-optim") == 0) opt.no_optim = 1;
        else if (strcmp(a, "--library-table") == 0) opt.library_table = 1;
        else if (!v) return 0;
        else if (strcmp(a, "--dir") == 0) opt.dir = v, i++;
        else if (strcmp(a, "--tp") == 0) opt.tp = atoi(v), i++;
        else if (strcmp(a, "--pp") == 0) opt.pp = atoi(v), i++;
        else if (strcmp(a, "--vpp") == 0) opt.vpp = atoi(v), i++;
        else if (strcmp(a, "--layers") == 0) opt.layers = atoi(v), i++;
        else if (strcmp(a, "--vocab") == 0) opt.vocab = atoi(v), i++;
        else if (strcmp(a, "--iter") == 0) opt.iter = atoll(v), i++;
        else if (strcmp(a, "--saved-tp") == 0) opt.saved_tp = atoi(v), i++;
        else if (strcmp(a, "--saved-pp") == 0) opt.saved_pp = atoi(v), i++;
        else if (strcmp(a, "--saved-dp") == 0) opt.saved_dp = atoi(v), i++;
        else return 0;
    }
    return opt.dir != NULL;
}

int main(int argc, char **argv) {
    const ckpt_case *chosen = NULL;
    for (int i = 0; argc >= 2 && i < N_CASES; i++)
        if (strcmp(argv[1], cases[i].name) == 0) chosen = &cases[i];
    if (chosen == NULL || !parse_options(argc, argv)) {
        fprintf(stderr, "usage: %s save|load|math|corrupt|bad_table --dir DIR [--tp T] [--pp P] "
                        "[--vpp V] [--layers L] [--vocab V] [--iter N] [--explicit] [--no-optim] "
                        "[--library-table] "
                        "[--saved-tp T --saved-pp P --saved-dp D]\n", argv[0]);
        return 2;
    }
    mc_comm_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.timeout_s = cd.watchdog_s = TIMEOUT_S;
    cd.argc = &argc;
    cd.argv = &argv;
    int rc = mc_case_init_world(&world, &cd);
    if (rc != MC_OK) return 1;
    me = world->rank;
    np = world->size;
    return mc_case_run(world, chosen->name, chosen->run, NULL);
}
