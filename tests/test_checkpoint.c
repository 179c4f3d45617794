/* test_checkpoint.c - checkpoints (megatron_semantics.md §14): the metadata format and its
   errors, CRC32, `latest`, a save / load round trip on the self backend in process, and under
   mpirun (build/tests/ckpt_cases) saves at one layout loaded at others: TP2 PP2 -> TP1 PP1,
   TP4 PP1, TP1 PP2; DP 2; VPP 2; vocabulary padding that changes with TP; a math change
   refused; truncated, corrupted and missing files; interrupted saves. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "megatron_c.h"
#include "tests/test_util.h"
#include "tests/ckpt_model.h"

#define RUN_LIMIT_S 120.0
#define OUT_CAP (1 << 17)

TestSuite(checkpoint, .timeout = 600);

/* ---------------------------------------------------------------------------------------------
   helpers */

static void make_tmp_dir(char *out, size_t cap) {
    snprintf(out, cap, "%s/mc_ckpt.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    cr_assert_not_null(mkdtemp(out), "mkdtemp %s", out);
}

/* Removes a test directory: files, and the files of its subdirectories (checkpoints are two
   levels deep). */
static void remove_tree(const char *path, int depth) {
    DIR *d = opendir(path);
    struct dirent *e;
    char child[4096];
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        if (stat(child, &st) == 0 && S_ISDIR(st.st_mode) && depth > 0)
            remove_tree(child, depth - 1);
        else
            unlink(child);
    }
    closedir(d);
    rmdir(path);
}

/* Runs ckpt_cases on np ranks; expects exit 0 and "N passed, 0 failed" with N > 0. */
static void run_case(int np, const char *args) {
    char prog[4096], cmd[8192];
    mc_test_sibling("ckpt_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s %s", prog, args);
    char *out = malloc(OUT_CAP);
    cr_assert_not_null(out);
    int rc = mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    int passed = 0, failed = -1;
    int found = mc_test_summary(out, &passed, &failed);
    cr_expect_eq(rc, 0, "ckpt_cases %s on %d ranks exited %d\n%s", args, np, rc, out);
    cr_expect(found && failed == 0 && passed > 0,
              "ckpt_cases %s on %d ranks: %d passed, %d failed\n%s", args, np, passed, failed, out);
    free(out);
}

/* Metadata text around `body`: the magic line, body, and a correct end line. */
static char *meta_text(const char *body) {
    size_t n = strlen(body) + 64;
    char *t = malloc(n + 16);
    cr_assert_not_null(t);
    int len = snprintf(t, n, "megatron_c-checkpoint 1\n%s", body);
    snprintf(t + len, 16, "end %08lx\n", (unsigned long)mc_crc32(0, t, (size_t)len));
    return t;
}

#define GOOD_HEAD                                                                     \
    "byte_order little\niteration 7\nconsumed_samples 224\noptimizer_step 7\n"       \
    "math_fingerprint 00000000000000aa\nlayout_fingerprint 00000000000000bb\n"       \
    "layout tp 2 pp 1 dp 1 cp 1 vpp 0 world 2\n"

static void expect_parse_error(const char *body, const char *needle) {
    char *t = meta_text(body);
    mc_checkpoint_meta m;
    int rc = mc_checkpoint_parse_metadata(&m, t, strlen(t), "meta.txt", NULL);
    cr_expect_eq(rc, MC_ERR_IO, "parse of\n%s\nreturned %s, want MC_ERR_IO", t, mc_err_name(rc));
    cr_expect(strstr(mc_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\" (text:\n%s)",
              mc_last_error(), needle, t);
    mc_checkpoint_meta_destroy(&m);
    free(t);
}

/* ---------------------------------------------------------------------------------------------
   CRC32, paths, latest */

Test(checkpoint, crc32_known_values) {
    cr_expect_eq(mc_crc32(0, "123456789", 9), 0xCBF43926u, "crc32(\"123456789\") = %08x",
                 mc_crc32(0, "123456789", 9));
    cr_expect_eq(mc_crc32(0, "", 0), 0u);
    cr_expect_eq(mc_crc32(0, "a", 1), 0xE8B7BE43u);
    cr_expect_eq(mc_crc32(0, "The quick brown fox jumps over the lazy dog", 43), 0x414FA339u);
    /* continuing from a previous result equals one pass */
    uint32_t part = mc_crc32(0, "12345", 5);
    cr_expect_eq(mc_crc32(part, "6789", 4), 0xCBF43926u);
}

Test(checkpoint, iteration_dir_names) {
    char buf[64];
    cr_assert_eq(mc_checkpoint_iteration_dir(buf, sizeof buf, "ckpt", 10), MC_OK);
    cr_expect_str_eq(buf, "ckpt/iter_0000010");
    cr_assert_eq(mc_checkpoint_iteration_dir(buf, sizeof buf, "ckpt", 1234567), MC_OK);
    cr_expect_str_eq(buf, "ckpt/iter_1234567");
    cr_assert_eq(mc_checkpoint_iteration_dir(buf, sizeof buf, "ckpt", MC_CKPT_RELEASE), MC_OK);
    cr_expect_str_eq(buf, "ckpt/release");
    cr_expect_eq(mc_checkpoint_iteration_dir(buf, 8, "ckpt", 10), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_checkpoint_iteration_dir(buf, sizeof buf, "ckpt", -3), MC_ERR_INVALID_ARG);
}

Test(checkpoint, latest_file) {
    char dir[512], path[600];
    long long it = -5;
    make_tmp_dir(dir, sizeof dir);
    cr_expect_eq(mc_checkpoint_latest(dir, &it), MC_ERR_IO);
    cr_expect(strstr(mc_last_error(), "no checkpoint in") != NULL, "%s", mc_last_error());
    snprintf(path, sizeof path, "%s/%s", dir, MC_CKPT_LATEST_FILE);
    static const struct {
        const char *text;
        int rc;
        long long it;
    } cases[] = {{"12\n", MC_OK, 12},       {"0", MC_OK, 0},     {"release\n", MC_OK, MC_CKPT_RELEASE},
                 {"abc\n", MC_ERR_IO, 0},   {"-4\n", MC_ERR_IO, 0}, {"", MC_ERR_IO, 0},
                 {"12x\n", MC_ERR_IO, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        fputs(cases[i].text, f);
        fclose(f);
        it = -5;
        int rc = mc_checkpoint_latest(dir, &it);
        cr_expect_eq(rc, cases[i].rc, "latest \"%s\": %s (%s)", cases[i].text, mc_err_name(rc),
                     mc_last_error());
        if (cases[i].rc == MC_OK) cr_expect_eq(it, cases[i].it, "latest \"%s\" -> %lld", cases[i].text, it);
        else cr_expect(strstr(mc_last_error(), "not an iteration number") != NULL, "%s", mc_last_error());
    }
    remove_tree(dir, 1);
}

/* ---------------------------------------------------------------------------------------------
   metadata parsing */

Test(checkpoint, metadata_parses) {
    char *t = meta_text(GOOD_HEAD
                        "config hidden_size 16\n"
                        "config layernorm_epsilon 9.99999975e-06\n"
                        "config a_field_from_the_future 3\n"
                        "something_new 1 2 3\n"
                        "tensor model b.weight f32 2 4 3 model.b.weight.bin 112 0000abcd\n"
                        "tensor exp_avg a.bias f32 1 5 exp_avg.a.bias.bin 84 00000001\n"
                        "tensor model a.bias f32 1 5 model.a.bias.bin 84 ffffffff\n"
                        "rng 0 1 rng_pp000_tp01.txt 99 12345678\n"
                        "rng 0 0 rng_pp000_tp00.txt 98 87654321\n");
    mc_gpt_config base;
    memset(&base, 0, sizeof base);
    base.num_layers = 6;   /* not in the file: kept */
    base.hidden_size = 99; /* in the file: replaced */
    mc_checkpoint_meta m;
    int rc = mc_checkpoint_parse_metadata(&m, t, strlen(t), "meta.txt", &base);
    cr_assert_eq(rc, MC_OK, "%s", mc_last_error());
    cr_expect_eq(m.format_version, 1);
    cr_expect_eq(m.iteration, 7);
    cr_expect_eq(m.consumed_samples, 224);
    cr_expect_eq(m.optimizer_step, 7);
    cr_expect_eq(m.math_fingerprint, 0xaaull);
    cr_expect_eq(m.layout_fingerprint, 0xbbull);
    cr_expect(m.tp == 2 && m.pp == 1 && m.dp == 1 && m.cp == 1 && m.vpp == 0 && m.world == 2);
    cr_expect_eq(m.config.num_layers, 6);
    cr_expect_eq(m.config.hidden_size, 16);
    cr_expect_eq(m.config.layernorm_epsilon, 1e-5f);
    cr_assert_eq(m.n_tensors, 3);
    /* sorted by kind (model, exp_avg, exp_avg_sq), then name */
    cr_expect_str_eq(m.tensors[0].name, "a.bias");
    cr_expect_str_eq(m.tensors[0].kind, "model");
    cr_expect_str_eq(m.tensors[1].name, "b.weight");
    cr_expect_str_eq(m.tensors[2].kind, "exp_avg");
    const mc_checkpoint_tensor *b = mc_checkpoint_meta_find(&m, "model", "b.weight");
    cr_assert_not_null(b);
    cr_expect(b->ndim == 2 && b->shape[0] == 4 && b->shape[1] == 3 && b->bytes == 112 &&
              b->crc32 == 0xabcdu);
    cr_expect_null(mc_checkpoint_meta_find(&m, "exp_avg_sq", "b.weight"));
    cr_expect_eq(m.tensors[0].shape[1], 1, "1-D tensors have shape[1] = 1");
    cr_assert_eq(m.n_rng, 2);
    cr_expect(m.rng[0].tp == 0 && m.rng[1].tp == 1 && m.rng[0].crc32 == 0x87654321u);
    mc_checkpoint_meta_destroy(&m);
    free(t);
}

Test(checkpoint, metadata_envelope_errors) {
    mc_checkpoint_meta m;
    const char *foreign = "{\"sharded_backend\": \"torch_dist\"}\n";
    cr_expect_eq(mc_checkpoint_parse_metadata(&m, foreign, strlen(foreign), "meta.txt", NULL),
                 MC_ERR_IO);
    cr_expect(strstr(mc_last_error(), "not a megatron_c checkpoint metadata file") != NULL, "%s",
              mc_last_error());
    mc_checkpoint_meta_destroy(&m);

    const char *v2 = "megatron_c-checkpoint 2\nend 00000000\n";
    cr_expect_eq(mc_checkpoint_parse_metadata(&m, v2, strlen(v2), "meta.txt", NULL), MC_ERR_IO);
    cr_expect(strstr(mc_last_error(), "format version 2, this build reads version 1") != NULL,
              "%s", mc_last_error());
    mc_checkpoint_meta_destroy(&m);

    char *t = meta_text(GOOD_HEAD);
    size_t len = strlen(t);
    /* cut anywhere inside the end line, or before it */
    size_t cuts[] = {len - 1, len - 5, len - 13, len / 2};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        cr_expect_eq(mc_checkpoint_parse_metadata(&m, t, cuts[i], "meta.txt", NULL), MC_ERR_IO);
        cr_expect(strstr(mc_last_error(), "meta.txt is truncated") != NULL, "cut at %zu: %s",
                  cuts[i], mc_last_error());
        mc_checkpoint_meta_destroy(&m);
    }
    /* one changed character anywhere before the end line */
    for (size_t at = 0; at < len - 13; at += 7) {
        char *bad = strdup(t);
        if (bad[at] == '\n' || at < 23) {
            free(bad);
            continue;
        }
        bad[at] = bad[at] == 'x' ? 'y' : 'x';
        cr_expect_eq(mc_checkpoint_parse_metadata(&m, bad, len, "meta.txt", NULL), MC_ERR_IO);
        cr_expect(strstr(mc_last_error(), "meta.txt is corrupted") != NULL, "byte %zu: %s", at,
                  mc_last_error());
        mc_checkpoint_meta_destroy(&m);
        free(bad);
    }
    cr_expect_eq(mc_checkpoint_parse_metadata(&m, t, len, "meta.txt", NULL), MC_OK, "%s",
                 mc_last_error());
    mc_checkpoint_meta_destroy(&m);
    free(t);
}

Test(checkpoint, metadata_line_errors) {
    expect_parse_error("byte_order little\n", "no \"iteration\" line");
    expect_parse_error("iteration 1\nbyte_order little\nmath_fingerprint 00000000000000aa\n"
                       "layout_fingerprint 00000000000000bb\n",
                       "no \"layout\" line");
    expect_parse_error(GOOD_HEAD "iteration  7\n", "line 9: malformed line");
    expect_parse_error(GOOD_HEAD "iteration seven\n", "line 9: iteration must be one integer");
    expect_parse_error(GOOD_HEAD "math_fingerprint abc\n", "math_fingerprint must be 16 hex digits");
    expect_parse_error(GOOD_HEAD "config hidden_size big\n", "config FIELD VALUE");
    expect_parse_error(GOOD_HEAD "layout tp 2 pp 2 dp 1 cp 1 vpp 0 world 2\n",
                       "layout tp 2 x pp 2 x dp 1 x cp 1 is not world 2");
    expect_parse_error(GOOD_HEAD "tensor model w f32 1 4 model.w.bin 80 00000000\n"
                                 "tensor bogus w f32 1 4 model.w.bin 80 00000000\n",
                       "line 10: tensor kind \"bogus\"");
    expect_parse_error(GOOD_HEAD "tensor model w bf16 1 4 model.w.bin 72 00000000\n",
                       "dtype \"bf16\" is not supported");
    expect_parse_error(GOOD_HEAD "tensor model w f32 2 4 model.w.bin 80 00000000\n",
                       "does not match");
    expect_parse_error(GOOD_HEAD "tensor model w f32 1 4 model.w.bin 81 00000000\n",
                       "81 bytes, but 64 header bytes + 4 f32 elements make 80");
    expect_parse_error(GOOD_HEAD "tensor model w f32 1 0 model.w.bin 64 00000000\n",
                       "dimension 0 (\"0\") must be in");
    expect_parse_error(GOOD_HEAD "tensor model w f32 1 4 ../w.bin 80 00000000\n",
                       "file name \"../w.bin\" is not a plain file name");
    expect_parse_error(GOOD_HEAD "tensor model ../w f32 1 4 w.bin 80 00000000\n",
                       "tensor name \"../w\" is not a valid parameter name");
    expect_parse_error(GOOD_HEAD "tensor model w f32 1 4 model.w.bin 80 0000zz00\n",
                       "checksum \"0000zz00\" is not 8 hex digits");
    expect_parse_error(GOOD_HEAD "tensor model w f32 1 4 a.bin 80 00000000\n"
                                 "tensor model w f32 1 4 b.bin 80 00000000\n",
                       "tensor model w is listed twice");
    expect_parse_error(GOOD_HEAD "rng 0 0 rng.txt 10\n", "an rng line has 6 fields");
    expect_parse_error(GOOD_HEAD "rng 0 0 a.txt 10 00000000\nrng 0 0 b.txt 10 00000000\n",
                       "rng state of pp 0 tp 0 is listed twice");
    expect_parse_error(GOOD_HEAD "\n", "line 9: empty line");
}

/* ---------------------------------------------------------------------------------------------
   in process: a round trip on the self backend */

typedef struct self_run {
    mc_comm *world;
    mc_parallel_state ps;
    ckpt_layout layout;
} self_run;

static void self_init(self_run *r) {
    memset(r, 0, sizeof *r);
    mc_comm_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.backend = MC_BACKEND_SELF;
    cr_assert_eq(mc_comm_init_world(&r->world, &cd), MC_OK, "%s", mc_last_error());
    mc_parallel_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.world = r->world;
    cr_assert_eq(mc_parallel_init(&r->ps, &pd), MC_OK, "%s", mc_last_error());
    r->layout.tp = r->layout.pp = 1;
    r->layout.layers = 2;
    r->layout.vocab = 64;
}

static void self_fini(self_run *r) {
    mc_parallel_destroy(&r->ps);
    mc_comm_destroy(r->world);
}

static mc_checkpoint_desc self_desc(self_run *r, ckpt_model *m, const char *dir,
                                    mc_rng_tracker *rng, long long iter) {
    mc_checkpoint_desc d;
    memset(&d, 0, sizeof d);
    d.dir = dir;
    d.ps = &r->ps;
    d.config = &m->cfg;
    d.params = &m->table;
    d.param_data = m->data[0];
    d.exp_avg = m->data[1];
    d.exp_avg_sq = m->data[2];
    d.rng = rng;
    d.iteration = iter;
    d.consumed_samples = 100 + iter;
    d.optimizer_step = iter;
    return d;
}

Test(checkpoint, round_trip_in_process) {
    self_run r;
    ckpt_model src, dst;
    mc_rng_tracker rng, rng2;
    mc_checkpoint_result res;
    char dir[512], path[1024], why[512];
    float u[3];
    self_init(&r);
    make_tmp_dir(dir, sizeof dir);
    strcat(dir, "/nested/ckpt");   /* created by the save */
    cr_assert_eq(ckpt_model_init(&src, &r.layout, NAN), 0);
    r.layout.library_table = 1;   /* the loading side places its parameters elsewhere */
    cr_assert_eq(ckpt_model_init(&dst, &r.layout, 0.0f), 0);
    cr_assert_neq(dst.table.info[0].offset, src.table.info[0].offset);
    memset(&rng, 0, sizeof rng);
    mc_rng_tracker_seed_megatron(&rng, 1234, 0, 0, 0, 0, 0, 0);
    mc_rng_uniform(mc_rng_tracker_current(&rng), u, 3);

    mc_checkpoint_desc d = self_desc(&r, &src, dir, &rng, 3);
    cr_assert_eq(mc_checkpoint_save(&d), MC_OK, "%s", mc_last_error());
    d = self_desc(&r, &src, dir, &rng, 4);
    cr_assert_eq(mc_checkpoint_save(&d), MC_OK, "%s", mc_last_error());
    cr_assert_eq(mc_checkpoint_save(&d), MC_OK, "saving an iteration again: %s", mc_last_error());

    /* the tensor file: header, then the elements */
    snprintf(path, sizeof path, "%s/iter_0000004/model.decoder.layers.1.mlp.linear_fc2.weight.bin", dir);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    unsigned char h[64];
    float first;
    cr_assert_eq(fread(h, 1, 64, f), 64u);
    cr_assert_eq(fread(&first, 4, 1, f), 1u);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    cr_expect(memcmp(h, "MCTENSOR", 8) == 0);
    cr_expect_eq(size, 64 + 4 * CKPT_H * CKPT_FFN);
    cr_expect_eq(first, ckpt_value(0, "decoder.layers.1.mlp.linear_fc2.weight", 0, 0));

    memset(&rng2, 0, sizeof rng2);
    mc_rng_tracker_seed_megatron(&rng2, 99, 0, 0, 0, 0, 0, 0);
    mc_checkpoint_desc l = self_desc(&r, &dst, dir, &rng2, 3);
    cr_assert_eq(mc_checkpoint_load(&l, 0, &res), MC_OK, "%s", mc_last_error());
    cr_expect_eq(res.iteration, 4);
    cr_expect_eq(res.consumed_samples, 104);
    cr_expect_eq(res.optimizer_step, 4);
    cr_expect_eq(res.resharded, 0);
    cr_expect_eq(res.rng_restored, 1, "%s", res.note);
    cr_expect_eq(res.optimizer_loaded, 1);
    for (int k = 0; k < 3; k++)
        cr_expect_eq(ckpt_model_compare(&dst, &r.layout, k, -1, why, sizeof why), 0, "%s", why);
    mc_rng_states a, b;
    mc_rng_tracker_get_states(&rng, &a);
    mc_rng_tracker_get_states(&rng2, &b);
    cr_expect(a.current.seed == b.current.seed && a.current.offset == b.current.offset &&
              a.n_streams == b.n_streams, "RNG states restored");

    /* an explicit iteration; MC_CKPT_LOAD_NO_RNG leaves the tracker alone */
    mc_rng_tracker_seed_megatron(&rng2, 99, 0, 0, 0, 0, 0, 0);
    cr_assert_eq(mc_checkpoint_load(&l, MC_CKPT_LOAD_ITERATION | MC_CKPT_LOAD_NO_RNG, &res),
                 MC_OK, "%s", mc_last_error());
    cr_expect_eq(res.iteration, 3);
    cr_expect_eq(res.rng_restored, 0);
    cr_expect_eq(mc_rng_tracker_current(&rng2)->seed, 99u);
    cr_expect(strstr(res.note, "MC_CKPT_LOAD_NO_RNG") != NULL, "%s", res.note);

    cr_expect_eq(mc_checkpoint_load(&l, 0x100, &res), MC_ERR_INVALID_ARG);
    cr_expect(strstr(mc_last_error(), "unknown flags 0x100") != NULL, "%s", mc_last_error());
    l.exp_avg_sq = NULL;
    cr_expect_eq(mc_checkpoint_load(&l, 0, &res), MC_ERR_INVALID_ARG);
    cr_expect(strstr(mc_last_error(), "given together") != NULL, "%s", mc_last_error());
    l.dir = NULL;
    cr_expect_eq(mc_checkpoint_save(&l), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_checkpoint_save(NULL), MC_ERR_INVALID_ARG);

    ckpt_model_free(&src);
    ckpt_model_free(&dst);
    self_fini(&r);
    dir[strlen(dir) - strlen("/nested/ckpt")] = '\0';
    remove_tree(dir, 3);
}

Test(checkpoint, table_errors_in_process) {
    self_run r;
    ckpt_model m;
    char dir[512];
    self_init(&r);
    make_tmp_dir(dir, sizeof dir);
    cr_assert_eq(ckpt_model_init(&m, &r.layout, NAN), 0);
    mc_checkpoint_desc d = self_desc(&r, &m, dir, NULL, 1);
    mc_param_info *qkv = &m.table.info[ckpt_find(&m.table, "decoder.layers.0.self_attention.linear_qkv.weight")];

    qkv->local_shape[0] = 24;   /* says TP 2 on a TP 1 layout */
    qkv->numel = 24 * CKPT_H;
    cr_expect_eq(mc_checkpoint_save(&d), MC_ERR_INVALID_DESC);
    cr_expect(strstr(mc_last_error(), "global_shape[0] (48) must be local_shape[0] (24) x "
                                      "tensor_model_parallel_size (1)") != NULL, "%s", mc_last_error());
    qkv->local_shape[0] = 48;
    qkv->numel = 47;
    cr_expect_eq(mc_checkpoint_save(&d), MC_ERR_INVALID_DESC);
    cr_expect(strstr(mc_last_error(), "numel (47) is not local_shape 48 x 16") != NULL, "%s",
              mc_last_error());
    qkv->numel = 48 * CKPT_H;
    qkv->offset = m.table.total;
    cr_expect_eq(mc_checkpoint_save(&d), MC_ERR_INVALID_DESC);
    cr_expect(strstr(mc_last_error(), "past the buffer's total") != NULL, "%s", mc_last_error());
    qkv->offset = m.table.info[0].offset;
    snprintf(qkv->name, sizeof qkv->name, "%s", m.table.info[0].name);
    cr_expect_eq(mc_checkpoint_save(&d), MC_ERR_INVALID_DESC);
    cr_expect(strstr(mc_last_error(), "appears twice") != NULL, "%s", mc_last_error());
    d.iteration = -1;
    cr_expect_eq(mc_checkpoint_save(&d), MC_ERR_INVALID_DESC, "the table is checked first");
    /* nothing was created by the failed saves but the directory itself */
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, MC_CKPT_LATEST_FILE);
    cr_expect_neq(access(path, F_OK), 0);
    ckpt_model_free(&m);
    self_fini(&r);
    remove_tree(dir, 2);
}

/* ---------------------------------------------------------------------------------------------
   multi-rank: save at one layout, load at others */

Test(checkpoint, reshard_tp2_pp2) {
    char dir[512], args[1024];
    make_tmp_dir(dir, sizeof dir);
    snprintf(args, sizeof args, "save --dir %s --tp 2 --pp 2", dir);
    run_case(4, args);
    const char *saved = "--saved-tp 2 --saved-pp 2 --saved-dp 1";
    snprintf(args, sizeof args, "load --dir %s %s", dir, saved);
    run_case(1, args);   /* TP1 PP1 */
    snprintf(args, sizeof args, "load --dir %s --tp 4 %s", dir, saved);
    run_case(4, args);   /* TP4 PP1 */
    snprintf(args, sizeof args, "load --dir %s --pp 2 %s", dir, saved);
    run_case(2, args);   /* TP1 PP2 */
    snprintf(args, sizeof args, "load --dir %s --tp 2 --pp 2 --library-table %s", dir, saved);
    run_case(4, args);   /* the same layout (offsets from mc_param_table_layout): RNG restored */
    remove_tree(dir, 2);
}

Test(checkpoint, reshard_dp2_eight_ranks) {
    char dir[512], args[1024];
    make_tmp_dir(dir, sizeof dir);
    /* DP 2: only dp rank 0 writes; offsets from mc_param_table_layout with the distributed
       optimizer's padding */
    snprintf(args, sizeof args, "save --dir %s --tp 2 --pp 2 --iter 20 --library-table", dir);
    run_case(8, args);
    const char *saved = "--iter 20 --saved-tp 2 --saved-pp 2 --saved-dp 2";
    snprintf(args, sizeof args, "load --dir %s %s", dir, saved);
    run_case(1, args);
    snprintf(args, sizeof args, "load --dir %s --tp 2 --library-table %s", dir, saved);
    run_case(4, args);   /* TP2 PP1 DP2 */
    remove_tree(dir, 2);
}

Test(checkpoint, reshard_virtual_pipeline) {
    char dir[512], args[1024];
    make_tmp_dir(dir, sizeof dir);
    snprintf(args, sizeof args, "save --dir %s --pp 2 --vpp 2", dir);
    run_case(4, args);   /* PP2 VPP2 DP2: rank 0 holds layers 0 and 2 */
    const char *saved = "--saved-tp 1 --saved-pp 2 --saved-dp 2";
    snprintf(args, sizeof args, "load --dir %s %s", dir, saved);
    run_case(1, args);
    snprintf(args, sizeof args, "load --dir %s --pp 2 %s", dir, saved);
    run_case(2, args);
    snprintf(args, sizeof args, "load --dir %s --tp 2 --pp 2 --vpp 2 %s", dir, saved);
    run_case(4, args);
    remove_tree(dir, 2);
}

Test(checkpoint, reshard_vocab_padding) {
    /* vocab 50, divisible by 8: padded to 56 at TP 1, 64 at TP 2 and TP 4 */
    char dir[512], args[1024];
    make_tmp_dir(dir, sizeof dir);
    snprintf(args, sizeof args, "save --dir %s --tp 2 --vocab 50", dir);
    run_case(2, args);
    snprintf(args, sizeof args, "load --dir %s --vocab 50 --saved-tp 2 --saved-pp 1 --saved-dp 1", dir);
    run_case(1, args);   /* 64 rows stored, 56 read */
    snprintf(args, sizeof args, "load --dir %s --tp 4 --vocab 50 --saved-tp 2 --saved-pp 1 --saved-dp 1", dir);
    run_case(4, args);
    snprintf(args, sizeof args, "save --dir %s --vocab 50 --iter 11", dir);
    run_case(1, args);
    snprintf(args, sizeof args,
             "load --dir %s --tp 2 --vocab 50 --iter 11 --saved-tp 1 --saved-pp 1 --saved-dp 1", dir);
    run_case(2, args);   /* 56 rows stored, rows 56..63 come back 0 */
    remove_tree(dir, 2);
}

Test(checkpoint, math_change_refused) {
    char dir[512], args[1024];
    make_tmp_dir(dir, sizeof dir);
    snprintf(args, sizeof args, "save --dir %s --tp 2 --iter 0", dir);
    run_case(2, args);
    snprintf(args, sizeof args, "math --dir %s --tp 2", dir);
    run_case(2, args);
    remove_tree(dir, 2);
}

Test(checkpoint, corrupted_files) {
    char dir[512], args[1024];
    make_tmp_dir(dir, sizeof dir);
    snprintf(args, sizeof args, "corrupt --dir %s --tp 2", dir);
    run_case(2, args);
    remove_tree(dir, 2);
}

Test(checkpoint, corrupted_files_single_rank) {
    char dir[512], args[1024];
    make_tmp_dir(dir, sizeof dir);
    snprintf(args, sizeof args, "corrupt --dir %s", dir);
    run_case(1, args);
    remove_tree(dir, 2);
}

Test(checkpoint, bad_tables_fail_on_every_rank) {
    char dir[512], args[1024];
    make_tmp_dir(dir, sizeof dir);
    snprintf(args, sizeof args, "bad_table --dir %s", dir);
    run_case(2, args);
    remove_tree(dir, 2);
}
