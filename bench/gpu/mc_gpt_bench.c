/* bench/gpu/mc_gpt_bench.c - megatron_c training GPT-2 124M / 350M on one GPU, the benchmark
   side of the peers in this directory (same shapes, same output line):

       make bench-gpu                      # megatron_c and the peers, one table
       ./build/bench/mc_gpt_bench --model 124M [--batch 16] [--seq 1024] [--warmup 5]
                                  [--steps 20] [--fp32] [--attention auto|own|cudnn|ref]
                                  [--profile]

   The model is megatron_c's GPTModel (pre-LN, learned positions, LayerNorm eps 1e-5, tanh
   GELU, biases, tied output layer, vocabulary 50257 padded to 50304, dropout off) trained with
   Megatron's --bf16 recipe on the CUDA op table: bf16 parameters and activations, fp32 main
   parameters, grads and AdamW state, clipping at 1.0; random tokens, 4 batches cycled. One
   line per run:

       BENCH impl=megatron_c model=124M tok_s=... mfu=... peak_gib=... ms_step=... steps=20
             warmup=5 batch=16 seq=1024 params=124475904 warmup_s=... loss_first=...
             loss_last=... status=ok

   tok_s = batch*seq*steps / seconds of the timed steps (the device synchronised before and
   after); mfu in percent = tok_s * (72 L h^2 + 12 L h T + 6 h V) / 989.4e12 (PaLM appendix B,
   V = 50304); peak_gib = the most device memory allocated through the op table at once (model,
   grads, optimizer state, activations, workspaces). --profile prints the per-category times
   (CUDA events) of one timed step. A failure prints the line with '-' and status=fail. With
   MC_CUDA_FUSE=0 (GELU not fused into the GEMMs) the impl reads megatron_c-unfused; the line
   before it says how many GELU GEMMs ran fused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "megatron_c.h"

#define PEAK_FLOPS 989.4e12

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct opts {
    const char *model;
    int batch, seq, warmup, steps, fp32, profile, attention;
    float lr;
} opts;

static void fail_line(const opts *o, const char *why) {
    printf("BENCH impl=megatron_c%s model=%s tok_s=- mfu=- peak_gib=- ms_step=- steps=%d warmup=%d "
           "batch=%d seq=%d params=- warmup_s=- loss_first=- loss_last=- status=fail\n",
           o->fp32 ? "-fp32" : "", o->model, o->steps, o->warmup, o->batch, o->seq);
    fprintf(stderr, "mc_gpt_bench: %s\n", why);
}

#if !defined(MC_ENABLE_CUDA)
int main(void) {
    opts o = {"124M", 16, 1024, 5, 20, 0, 0, 0, 3e-4f};
    fail_line(&o, "built without MC_ENABLE_CUDA (make bench-gpu builds it with the CUDA table)");
    return 1;
}
#else

#define CHECK(call)                                                                            \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_ != MC_OK) {                                                                    \
            char why_[1400];                                                                   \
            snprintf(why_, sizeof why_, "%s -> %s: %s", #call, mc_err_name(rc_),               \
                     mc_last_error());                                                         \
            fail_line(&o, why_);                                                               \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

int main(int argc, char **argv) {
    opts o = {"124M", 16, 1024, 5, 20, 0, 0, 0, 3e-4f};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) o.model = v, i++;
        else if (!strcmp(a, "--batch") && v) o.batch = atoi(v), i++;
        else if (!strcmp(a, "--seq") && v) o.seq = atoi(v), i++;
        else if (!strcmp(a, "--warmup") && v) o.warmup = atoi(v), i++;
        else if (!strcmp(a, "--steps") && v) o.steps = atoi(v), i++;
        else if (!strcmp(a, "--lr") && v) o.lr = (float)atof(v), i++;
        else if (!strcmp(a, "--fp32")) o.fp32 = 1;
        else if (!strcmp(a, "--profile")) o.profile = 1;
        else if (!strcmp(a, "--attention") && v) {
            o.attention = !strcmp(v, "own") ? 1 : !strcmp(v, "cudnn") ? 2 : !strcmp(v, "ref") ? 3 : 0;
            i++;
        } else {
            fprintf(stderr, "usage: mc_gpt_bench [--model 124M|350M] [--batch B] [--seq T] "
                    "[--warmup N] [--steps N] [--lr X] [--fp32] [--attention auto|own|cudnn|ref] "
                    "[--profile]\n");
            return 2;
        }
    }
    int L, H, NH;
    if (!strcmp(o.model, "124M")) L = 12, H = 768, NH = 12;
    else if (!strcmp(o.model, "350M")) L = 24, H = 1024, NH = 16;
    else {
        fail_line(&o, "--model must be 124M or 350M");
        return 2;
    }
    if (o.batch < 1 || o.seq < 1 || o.steps < 1 || o.warmup < 1) {
        fail_line(&o, "--batch, --seq, --steps and --warmup must be >= 1");
        return 2;
    }
    if (mc_cuda_device_count() == 0) {
        fail_line(&o, "no CUDA device");
        return 1;
    }
    mc_ops ops;
    mc_cuda_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.attention = o.attention;
    CHECK(mc_ops_cuda_init(&ops, &cd));
    mc_dtype dt = o.fp32 ? MC_F32 : MC_BF16;

    mc_gpt_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.num_layers = L, cfg.hidden_size = H, cfg.num_attention_heads = NH;
    cfg.vocab_size = 50257, cfg.seq_length = o.seq, cfg.max_position_embeddings = o.seq;
    cfg.micro_batch_size = o.batch, cfg.seed = 1234;
    cfg.hidden_dropout = cfg.attention_dropout = MC_DROPOUT_OFF;
    mc_gpt gpt;
    mc_gpt_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.config = cfg, gd.ops = &ops, gd.dtype = dt;
    CHECK(mc_gpt_init(&gpt, &gd));
    mc_ddp ddp;
    mc_ddp_desc dd;
    memset(&dd, 0, sizeof dd);
    dd.table = &gpt.table, dd.grads = gpt.grads, dd.ops = &ops;
    CHECK(mc_ddp_init(&ddp, &dd));
    mc_optimizer opt;
    mc_optimizer_desc od;
    memset(&od, 0, sizeof od);
    od.ddp = &ddp, od.params = gpt.params, od.params_dtype = dt;
    od.lr = o.lr, od.lr_decay_style = MC_LR_DECAY_CONSTANT, od.clip_grad = 1.0f;
    CHECK(mc_optimizer_init(&opt, &od));

    size_t params = 0;
    for (int i = 0; i < gpt.table.count; i++) params += gpt.table.info[i].numel;
    int N = gpt.N, V = gpt.vocab_padded;
    double fpt = 72.0 * L * (double)H * H + 12.0 * L * (double)H * o.seq + 6.0 * H * (double)V;
    /* 4 random batches, cycled (as the peers) */
    int *data = (int *)malloc((size_t)5 * N * sizeof(int));
    uint64_t seed = 1234;
    for (size_t i = 0; i < (size_t)5 * N; i++)
        data[i] = (int)(mc_rng_bits_at(seed, i) % (uint32_t)cfg.vocab_size);
    printf("# megatron_c: %s; %s; GPT-2 %s (L%d h%d heads %d), batch %d, seq %d, %zu parameters, "
           "%.1f MFLOP per token\n", mc_ops_cuda_describe(&ops), o.fp32 ? "fp32" : "bf16 (--bf16)",
           o.model, L, H, NH, o.batch, o.seq, params, fpt / 1e6);
    fflush(stdout);

    double loss_first = 0.0, loss_last = 0.0, t_warm = now_s(), t_steps = 0.0;
    int total = o.warmup + o.steps + (o.profile ? 1 : 0);
    for (int step = 0; step < total; step++) {
        const int *tokens = data + (size_t)(step % 4) * N, *labels = tokens + N;
        double sum = 0.0;
        if (step == o.warmup) {   /* warm-up done: cuBLASLt plans and cuDNN graphs exist */
            CHECK(ops.synchronize(&ops));
            t_steps = now_s();
            t_warm = t_steps - t_warm;
        }
        if (step == o.warmup + o.steps) {   /* one more, profiled step, not timed */
            CHECK(ops.synchronize(&ops));
            t_steps = now_s() - t_steps;
            CHECK(mc_ops_cuda_profile(&ops, 1));
        }
        CHECK(mc_ddp_zero_grad(&ddp));
        CHECK(mc_gpt_forward(&gpt, 0, 0, tokens, labels, NULL, NULL, &sum));
        CHECK(mc_gpt_backward(&gpt, 0, 0, NULL, 1.0f / (float)N, NULL));
        CHECK(mc_finalize_model_grads(NULL, &ddp, NULL, NULL, 0, NULL));
        CHECK(mc_optimizer_step(&opt));
        if (step == 0) loss_first = sum / N;
        if (step < o.warmup + o.steps) loss_last = sum / N;
    }
    if (o.profile) {
        static const char *const names[MC_PROF_COUNT] = {"gemm", "attention", "norms", "loss",
                                                         "optimizer", "other", "communication"};
        double ms[MC_PROF_COUNT], all = 0.0;
        CHECK(mc_ops_cuda_profile_read(&ops, ms));
        CHECK(mc_ops_cuda_profile(&ops, 0));
        printf("# megatron_c %s step breakdown (ms of one step, CUDA events):", o.model);
        for (int k = 0; k < MC_PROF_COUNT; k++) printf(" %s %.2f", names[k], ms[k]), all += ms[k];
        printf(" | sum %.2f\n", all);
    } else {
        CHECK(ops.synchronize(&ops));
        t_steps = now_s() - t_steps;
    }
    double tok_s = (double)o.batch * o.seq * o.steps / t_steps;
    double mfu = 100.0 * tok_s * fpt / PEAK_FLOPS;
    double peak = (double)mc_ops_cuda_peak_bytes(&ops, 0) / (1024.0 * 1024.0 * 1024.0);
    int finite = isfinite(loss_last) && isfinite(loss_first);
    const char *fusion = mc_ops_cuda_fusion(&ops);
    int unfused = strncmp(fusion, "off", 3) == 0;
    printf("# megatron_c %s gelu fusion %s\n", o.model, fusion);
    printf("BENCH impl=megatron_c%s%s model=%s tok_s=%.0f mfu=%.2f peak_gib=%.2f ms_step=%.2f "
           "steps=%d warmup=%d batch=%d seq=%d params=%zu warmup_s=%.1f loss_first=%.4f "
           "loss_last=%.4f status=%s\n",
           o.fp32 ? "-fp32" : "", unfused ? "-unfused" : "", o.model, tok_s, mfu, peak,
           1e3 * t_steps / o.steps, o.steps, o.warmup, o.batch, o.seq, params, t_warm, loss_first, loss_last,
           finite ? "ok" : "nan-loss");
    fflush(stdout);
    mc_optimizer_destroy(&opt);
    mc_ddp_destroy(&ddp);
    mc_gpt_destroy(&gpt);
    mc_ops_cuda_destroy(&ops);
    free(data);
    return finite ? 0 : 1;
}
#endif
