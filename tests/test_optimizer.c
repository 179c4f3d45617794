/* test_optimizer.c - AdamW, the learning-rate schedule, the grad norm and clipping on one rank
   (megatron_semantics.md §12; the multi-rank behaviour is in ddp_cases).

   The AdamW reference is the decoupled-weight-decay formula evaluated in fp64 next to the
   library's fp32 step; the schedule values are the closed forms of Megatron's
   OptimizerParamScheduler at chosen steps (warmup, warmup end, mid decay, decay end, past it). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

TestSuite(optimizer, .timeout = 30);

#define PI 3.14159265358979323846

/* ---------------------------------------------------------------------------------------------
   a one-rank model: w [4, 3] (decays), b [3] (bias: no decay), ln [3] (norm: no decay),
   optionally an output copy of the embedding flagged shared */

typedef struct rig {
    mc_param_table table;
    mc_ddp ddp;
    mc_optimizer opt;
    float *params, *grads;
} rig;

static mc_param_info shape(int rows, int cols, int no_decay) {
    mc_param_info p;
    memset(&p, 0, sizeof p);
    p.ndim = cols > 0 ? 2 : 1;
    p.global_shape[0] = p.local_shape[0] = rows;
    p.global_shape[1] = p.local_shape[1] = cols > 0 ? cols : 1;
    p.partition_dim = -1;
    p.no_weight_decay = no_decay;
    p.layer = -1;
    return p;
}

static void rig_build(rig *r, int with_shared, mc_optimizer_desc od) {
    memset(r, 0, sizeof *r);
    mc_param_info w = shape(4, 3, 0), b = shape(3, 0, 1), ln = shape(3, 0, 1);
    cr_assert_geq(mc_param_table_add(&r->table, "w", &w), 0, "%s", mc_last_error());
    cr_assert_geq(mc_param_table_add(&r->table, "b", &b), 0, "%s", mc_last_error());
    cr_assert_geq(mc_param_table_add(&r->table, "ln", &ln), 0, "%s", mc_last_error());
    if (with_shared) {
        mc_param_info out = shape(5, 2, 0);
        out.shared = out.shared_embedding = 1;
        cr_assert_geq(mc_param_table_add(&r->table, "output_layer.weight", &out), 0, "%s",
                      mc_last_error());
    }
    cr_assert_eq(mc_param_table_layout(&r->table, &(mc_param_layout_desc){0}), MC_OK, "%s",
                 mc_last_error());
    r->params = calloc(r->table.total, sizeof(float));
    r->grads = calloc(r->table.total, sizeof(float));
    cr_assert(r->params && r->grads);
    for (size_t i = 0; i < r->table.total; i++) r->params[i] = 0.5f - 0.07f * (float)i;
    int rc = mc_ddp_init(&r->ddp, &(mc_ddp_desc){.table = &r->table, .grads = r->grads});
    cr_assert_eq(rc, MC_OK, "mc_ddp_init: %s", mc_last_error());
    od.ddp = &r->ddp;
    od.params = r->params;
    rc = mc_optimizer_init(&r->opt, &od);
    cr_assert_eq(rc, MC_OK, "mc_optimizer_init: %s", mc_last_error());
}

static void rig_free(rig *r) {
    mc_optimizer_destroy(&r->opt);
    cr_expect_eq(mc_ddp_destroy(&r->ddp), MC_OK);
    mc_param_table_destroy(&r->table);
    free(r->params);
    free(r->grads);
}

static float *param(rig *r, const char *name) {
    int i = mc_param_table_find(&r->table, name);
    cr_assert_geq(i, 0);
    return r->params + r->table.info[i].offset;
}

/* ---------------------------------------------------------------------------------------------
   AdamW */

/* Three steps with changing grads against the fp64 formula:
     m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  m^ = m / (1-b1^t);  v^ = v / (1-b2^t)
     p = p - lr (m^ / (sqrt(v^) + eps) + wd_p p)      wd_p = 0 for biases and norms */
Test(optimizer, adamw_matches_the_fp64_formula) {
    const double lr = 1e-2, b1 = 0.8, b2 = 0.95, eps = 1e-6, wd = 0.1;
    rig r;
    rig_build(&r, 0, (mc_optimizer_desc){.lr = (float)lr, .beta1 = (float)b1, .beta2 = (float)b2,
                                         .eps = (float)eps, .weight_decay = (float)wd,
                                         .clip_grad = MC_CLIP_GRAD_OFF,
                                         .lr_decay_style = MC_LR_DECAY_CONSTANT});
    size_t n = r.table.total;
    double *p = calloc(n, sizeof *p), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
    float *want = calloc(n, sizeof *want);
    cr_assert(p && m && v && want);
    for (size_t i = 0; i < n; i++) p[i] = r.params[i];
    for (int t = 1; t <= 3; t++) {
        cr_assert_eq(mc_ddp_zero_grad(&r.ddp), MC_OK);
        for (size_t i = 0; i < n; i++) r.grads[i] = (float)(sin(0.9 * (double)i + t) * 0.3);
        for (int k = 0; k < r.table.count; k++) {
            const mc_param_info *info = &r.table.info[k];
            double wd_p = info->no_weight_decay ? 0.0 : wd;
            for (size_t i = info->offset; i < info->offset + info->numel; i++) {
                double g = r.grads[i];
                m[i] = b1 * m[i] + (1 - b1) * g;
                v[i] = b2 * v[i] + (1 - b2) * g * g;
                double mh = m[i] / (1 - pow(b1, t)), vh = v[i] / (1 - pow(b2, t));
                p[i] -= lr * (mh / (sqrt(vh) + eps) + wd_p * p[i]);
            }
        }
        int rc = mc_optimizer_step(&r.opt);
        cr_assert_eq(rc, MC_OK, "step %d: %s", t, mc_last_error());
        for (size_t i = 0; i < n; i++) want[i] = (float)p[i];
        cr_assert_eq(mc_test_allclose(r.params, want, n, 1e-6f, 1e-5f), 0, "step %d", t);
        cr_expect_eq(r.opt.iteration, t);
        cr_expect_float_eq(r.opt.last_lr, (float)lr, 1e-9);
    }
    /* The exported state is the formula's m and v. */
    float got[12];
    int w = mc_param_table_find(&r.table, "w");
    cr_assert_eq(mc_optimizer_get_state(&r.opt, w, MC_OPTIM_EXP_AVG_SQ, got), MC_OK);
    for (int i = 0; i < 12; i++) want[i] = (float)v[r.table.info[w].offset + (size_t)i];
    mc_test_allclose(got, want, 12, 1e-9f, 1e-5f);
    free(p);
    free(m);
    free(v);
    free(want);
    rig_free(&r);
}

/* Zero grads leave Adam's update at 0, so only the decay moves a param: decaying params
   shrink by exactly (1 - lr wd), biases and norms (no_weight_decay) stay put. */
Test(optimizer, no_weight_decay_for_biases_and_norms) {
    rig r;
    rig_build(&r, 0, (mc_optimizer_desc){.lr = 0.5f, .weight_decay = 0.2f,
                                         .clip_grad = MC_CLIP_GRAD_OFF,
                                         .lr_decay_style = MC_LR_DECAY_CONSTANT});
    float w0[12], b0[3], ln0[3];
    memcpy(w0, param(&r, "w"), sizeof w0);
    memcpy(b0, param(&r, "b"), sizeof b0);
    memcpy(ln0, param(&r, "ln"), sizeof ln0);
    cr_assert_eq(mc_ddp_zero_grad(&r.ddp), MC_OK);
    cr_assert_eq(mc_optimizer_step(&r.opt), MC_OK, "%s", mc_last_error());
    for (int i = 0; i < 12; i++)
        cr_expect_float_eq(param(&r, "w")[i], w0[i] * (1.0f - 0.5f * 0.2f), 1e-6,
                           "w[%d] decays", i);
    cr_expect_arr_eq(param(&r, "b"), b0, sizeof b0, "bias: no decay");
    cr_expect_arr_eq(param(&r, "ln"), ln0, sizeof ln0, "norm: no decay");
    rig_free(&r);

    /* MC_WEIGHT_DECAY_OFF: nothing decays. */
    rig_build(&r, 0, (mc_optimizer_desc){.lr = 0.5f, .weight_decay = MC_WEIGHT_DECAY_OFF,
                                         .clip_grad = MC_CLIP_GRAD_OFF});
    memcpy(w0, param(&r, "w"), sizeof w0);
    cr_assert_eq(mc_optimizer_step(&r.opt), MC_OK, "%s", mc_last_error());
    cr_expect_arr_eq(param(&r, "w"), w0, sizeof w0, "weight decay off");
    rig_free(&r);
}

/* ---------------------------------------------------------------------------------------------
   learning-rate schedule: lr 1, min_lr 0.1, warmup 10, decay over 110 (train_iters) */

static double lr_at(mc_optimizer_desc d, long long s) { return mc_optimizer_lr_at(&d, s); }

Test(optimizer, lr_schedule_cosine) {
    mc_optimizer_desc d = {.lr = 1.0f, .min_lr = 0.1f, .lr_warmup_iters = 10, .train_iters = 110};
    cr_expect_float_eq(lr_at(d, 0), 0.0, 1e-12, "warmup starts at lr_warmup_init = 0");
    cr_expect_float_eq(lr_at(d, 5), 0.5, 1e-7, "half-way through the warmup");
    cr_expect_float_eq(lr_at(d, 10), 1.0, 1e-7, "warmup end: the peak");
    /* s = 11: ratio (11 - 10) / (110 - 10) = 0.01 */
    cr_expect_float_eq(lr_at(d, 11), 0.1 + 0.9 * 0.5 * (cos(PI * 0.01) + 1.0), 1e-7);
    cr_expect_float_eq(lr_at(d, 60), 0.55, 1e-7, "mid decay: ratio 0.5, cos = 0");
    cr_expect_float_eq(lr_at(d, 85), 0.1 + 0.9 * 0.5 * (cos(PI * 0.75) + 1.0), 1e-7);
    cr_expect_float_eq(lr_at(d, 110), 0.1, 1e-7, "decay end: min_lr");
    cr_expect_float_eq(lr_at(d, 111), 0.1, 1e-7, "past the decay: min_lr");
    cr_expect_float_eq(lr_at(d, 5000), 0.1, 1e-7);
    d.lr_decay_iters = 60;   /* an explicit decay span overrides train_iters */
    cr_expect_float_eq(lr_at(d, 35), 0.55, 1e-7, "ratio (35 - 10) / 50 = 0.5");
}

Test(optimizer, lr_schedule_linear_constant_and_init) {
    mc_optimizer_desc d = {.lr = 1.0f, .min_lr = 0.1f, .lr_warmup_iters = 10, .train_iters = 110,
                           .lr_decay_style = MC_LR_DECAY_LINEAR};
    cr_expect_float_eq(lr_at(d, 35), 0.1 + 0.9 * 0.75, 1e-7, "linear: ratio 0.25");
    cr_expect_float_eq(lr_at(d, 110), 0.1, 1e-7);
    d.lr_decay_style = MC_LR_DECAY_CONSTANT;
    cr_expect_float_eq(lr_at(d, 3), 0.3, 1e-7, "constant still warms up");
    cr_expect_float_eq(lr_at(d, 500), 1.0, 1e-7, "constant after the warmup");
    d.lr_decay_style = MC_LR_DECAY_COSINE;
    d.lr_warmup_init = 0.2f;
    cr_expect_float_eq(lr_at(d, 5), 0.2 + 0.8 * 0.5, 1e-7, "warmup from lr_warmup_init");
    mc_optimizer_desc flat = {.lr = 3e-4f};
    cr_expect_float_eq(lr_at(flat, 0), 3e-4, 1e-10, "no warmup, no decay span: constant");
    cr_expect_float_eq(lr_at(flat, 1000), 3e-4, 1e-10);
}

/* Step k runs at lr_at(k - 1): with a 2-step warmup the rates are 0, lr/2, lr. */
Test(optimizer, steps_follow_the_schedule) {
    rig r;
    rig_build(&r, 0, (mc_optimizer_desc){.lr = 0.02f, .lr_warmup_iters = 2, .train_iters = 4,
                                         .clip_grad = MC_CLIP_GRAD_OFF});
    const float want[] = {0.0f, 0.01f, 0.02f, 0.01f};   /* s = 3: ratio 0.5 -> min + half */
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(mc_optimizer_step(&r.opt), MC_OK, "%s", mc_last_error());
        cr_expect_float_eq(r.opt.last_lr, want[k], 1e-8, "step %d lr %g", k + 1,
                           (double)r.opt.last_lr);
    }
    cr_expect_eq(r.opt.lr_steps, 4);
    rig_free(&r);
}

/* ---------------------------------------------------------------------------------------------
   grad norm and clipping */

/* grads: w = 0.5 (12 elements), b = 1 (3), ln = 0, output copy (shared) = 100:
   norm^2 = 12 * 0.25 + 3 = 6 (the shared copy is not counted). */
static void set_clip_grads(rig *r) {
    cr_assert_eq(mc_ddp_zero_grad(&r->ddp), MC_OK);
    const char *names[] = {"w", "b", "ln", "output_layer.weight"};
    const float values[] = {0.5f, 1.0f, 0.0f, 100.0f};
    for (int k = 0; k < 4; k++) {
        int i = mc_param_table_find(&r->table, names[k]);
        for (size_t e = 0; e < r->table.info[i].numel; e++)
            r->grads[r->table.info[i].offset + e] = values[k];
    }
}

Test(optimizer, clip_coefficient) {
    rig r;
    rig_build(&r, 1, (mc_optimizer_desc){.lr = 1e-3f});   /* clip_grad defaults to 1.0 */
    set_clip_grads(&r);
    double norm = -1;
    cr_assert_eq(mc_optimizer_grad_norm(&r.opt, &norm), MC_OK);
    cr_expect_float_eq(norm, sqrt(6.0), 1e-12, "the shared copy is not counted: %g", norm);
    cr_assert_eq(mc_optimizer_step(&r.opt), MC_OK, "%s", mc_last_error());
    double coeff = 1.0 / (sqrt(6.0) + 1e-6);
    cr_expect_float_eq(r.opt.last_grad_norm, sqrt(6.0), 1e-12);
    cr_expect_float_eq(r.opt.last_clip_coeff, (float)coeff, 1e-7);
    int w = mc_param_table_find(&r.table, "w");
    cr_expect_float_eq(r.grads[r.table.info[w].offset], (float)(0.5 * coeff), 1e-7,
                       "grads are scaled by the coefficient");
    cr_assert_eq(mc_optimizer_grad_norm(&r.opt, &norm), MC_OK);
    cr_expect_float_eq(norm, 1.0, 1e-5, "clipped to clip_grad");
    rig_free(&r);

    /* clip_grad above the norm: coefficient >= 1, grads untouched. */
    rig_build(&r, 1, (mc_optimizer_desc){.lr = 1e-3f, .clip_grad = 10.0f});
    set_clip_grads(&r);
    cr_assert_eq(mc_optimizer_step(&r.opt), MC_OK, "%s", mc_last_error());
    cr_expect_float_eq(r.opt.last_grad_norm, sqrt(6.0), 1e-12);
    cr_expect_float_eq(r.opt.last_clip_coeff, 1.0f, 0.0);
    cr_expect_float_eq(r.grads[r.table.info[w].offset], 0.5f, 0.0);
    rig_free(&r);

    /* Clipping off: no norm (reported 0, as Megatron), grads untouched. */
    rig_build(&r, 1, (mc_optimizer_desc){.lr = 1e-3f, .clip_grad = MC_CLIP_GRAD_OFF});
    set_clip_grads(&r);
    cr_assert_eq(mc_optimizer_step(&r.opt), MC_OK, "%s", mc_last_error());
    cr_expect_float_eq(r.opt.last_grad_norm, 0.0, 0.0);
    cr_expect_float_eq(r.grads[r.table.info[w].offset], 0.5f, 0.0);
    rig_free(&r);
}

Test(optimizer, non_finite_norm_skips_the_step) {
    rig r;
    rig_build(&r, 0, (mc_optimizer_desc){.lr = 1e-3f});
    float before[12];
    memcpy(before, param(&r, "w"), sizeof before);
    r.grads[1] = NAN;
    cr_expect_eq(mc_optimizer_step(&r.opt), MC_ERR_STATE);
    cr_expect(mc_test_contains(mc_last_error(), "grad norm is nan"), "%s", mc_last_error());
    cr_expect_arr_eq(param(&r, "w"), before, sizeof before, "params untouched");
    cr_expect_eq(r.opt.iteration, 0);
    rig_free(&r);
}

/* ---------------------------------------------------------------------------------------------
   state export / import and validation */

Test(optimizer, state_roundtrip) {
    rig r;
    rig_build(&r, 0,
              (mc_optimizer_desc){.lr = 1e-3f, .beta1 = 0.5f, .clip_grad = MC_CLIP_GRAD_OFF});
    for (size_t i = 0; i < r.table.total; i++) r.grads[i] = 0.25f;
    cr_assert_eq(mc_optimizer_step(&r.opt), MC_OK, "%s", mc_last_error());
    int b = mc_param_table_find(&r.table, "b");
    float m[3], in[3] = {1.0f, 2.0f, 3.0f};
    size_t lo = 9, hi = 9;
    cr_assert_eq(mc_optimizer_owned_range(&r.opt, b, &lo, &hi), MC_OK);
    cr_expect(lo == 0 && hi == 3, "one rank owns all of b: [%zu, %zu)", lo, hi);
    cr_assert_eq(mc_optimizer_get_state(&r.opt, b, MC_OPTIM_EXP_AVG, m), MC_OK);
    for (int i = 0; i < 3; i++) cr_expect_float_eq(m[i], 0.5f * 0.25f, 1e-9, "m = (1-b1) g");
    cr_assert_eq(mc_optimizer_set_state(&r.opt, b, MC_OPTIM_EXP_AVG_SQ, in), MC_OK);
    cr_assert_eq(mc_optimizer_get_state(&r.opt, b, MC_OPTIM_EXP_AVG_SQ, m), MC_OK);
    cr_expect_arr_eq(m, in, sizeof in);
    cr_expect_eq(mc_optimizer_get_state(&r.opt, 99, MC_OPTIM_EXP_AVG, m), MC_ERR_INVALID_ARG);
    rig_free(&r);
}

Test(optimizer, rejects_bad_descs) {
    rig r;
    rig_build(&r, 0, (mc_optimizer_desc){.lr = 1e-3f});
    mc_optimizer o;
    mc_optimizer_desc d = {.ddp = &r.ddp, .params = r.params};
    cr_expect_eq(mc_optimizer_init(&o, &d), MC_ERR_INVALID_DESC, "lr is required");
    cr_expect(mc_test_contains(mc_last_error(), "lr (0)"), "%s", mc_last_error());
    d.lr = 1e-3f;
    d.min_lr = 1e-2f;
    cr_expect_eq(mc_optimizer_init(&o, &d), MC_ERR_INVALID_DESC, "min_lr > lr");
    cr_expect(mc_test_contains(mc_last_error(), "min_lr (0.01)"), "%s", mc_last_error());
    d.min_lr = 0;
    d.lr_warmup_iters = 100;
    d.train_iters = 100;
    cr_expect_eq(mc_optimizer_init(&o, &d), MC_ERR_INVALID_DESC, "warmup >= decay");
    cr_expect(mc_test_contains(mc_last_error(), "lr_warmup_iters (100)"), "%s", mc_last_error());
    d.lr_warmup_iters = 0;
    d.beta2 = 1.0f;
    cr_expect_eq(mc_optimizer_init(&o, &d), MC_ERR_INVALID_DESC, "beta2 = 1");
    d.beta2 = 0;
    d.ddp = NULL;
    cr_expect_eq(mc_optimizer_init(&o, &d), MC_ERR_INVALID_DESC, "no ddp");
    rig_free(&r);
}
