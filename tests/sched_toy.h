/* tests/sched_toy.h - a toy pipeline model for the schedule tests (test_schedules.c and
   tests/mpi_cases/sched_cases.c), with the single-process reference it must match.

   Virtual stage s (chunk c on pp rank r: s = c * P + r) computes, element-wise on vectors of
   TOY_E floats,
       y = w_s * x + b_s
   and the last virtual stage's loss is sum(y^2 / 2) over TOY_E "tokens". Micro-batch i feeds
   x = toy_input(i, .) into virtual stage 0. The reference runs the whole chain in one process,
   micro-batch by micro-batch, with the same float operations in the same order, so a correct
   schedule gives the same gradients up to rounding of the P2P-free path (exactly, in practice).

   The hooks log every call (F, B, grad-sync S, finalize Z), and check the schedule's buffer
   contract: an input stays unchanged until its backward (the backward reads the pointer it was
   given, not a copy), output_grad is NULL exactly on the last virtual stage, input is NULL
   exactly on the first. Include "megatron_c.h" first. */
#ifndef SCHED_TOY_H_INCLUDED
#define SCHED_TOY_H_INCLUDED

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOY_E 8             /* elements of every P2P tensor */
#define TOY_MAX_V 4         /* chunks per stage */
#define TOY_MAX_STAGES 32   /* virtual stages P * V */

/* Parameters of virtual stage s, element e: weights near 1 so that long chains stay in range. */
static inline float toy_weight(int s, int e) { return 0.75f + 0.0625f * (float)((s * 5 + e * 3) % 7); }
static inline float toy_bias(int s, int e) { return 0.03125f * (float)((s * 3 + e) % 5 - 2); }
/* Input of micro-batch i, element e. */
static inline float toy_input(int i, int e) {
    return 0.125f * (float)((i * 13 + e * 5) % 11 - 5) + 0.015625f * (float)i;
}

typedef struct toy_event {
    char kind;    /* 'F' forward, 'B' backward, 'S' grad_sync, 'Z' finalize */
    int chunk;
    int mb;       /* -1 for S and Z */
    int enable;   /* S only */
} toy_event;

typedef struct toy {
    int pp, rank, v, m;
    float w[TOY_MAX_V][TOY_E], b[TOY_MAX_V][TOY_E];
    float dw[TOY_MAX_V][TOY_E], db[TOY_MAX_V][TOY_E];
    const float **in_ptr;   /* (V*M) the input pointer forward got, read again by backward */
    float *in_copy;         /* (V*M*E) its values at forward time */
    float *out;             /* (V*M*E) outputs y: sent by the schedule, kept until backward */
    float grad[TOY_E];      /* input gradient of the latest backward */
    float data[TOY_E];      /* the first virtual stage's input of the current forward */
    float *first_in;        /* (M*E) inputs of virtual stage 0 */
    toy_event *ev;
    int n_ev, cap_ev;
    int fail_forward_at;    /* forward call number (0-based) that returns an error; -1 none */
    int n_forward;
    int use_loss_func;      /* 1: the last stage returns y and toy_loss_func turns it into the
                               loss (hooks.loss_func); 0: forward_step sets the loss itself */
    int n_loss_calls;       /* toy_loss_func calls */
    int contract_errors;    /* buffer-contract violations seen by the hooks */
    char first_error[256];
} toy;

static inline int toy_stage(const toy *t, int chunk) { return chunk * t->pp + t->rank; }
static inline int toy_is_first(const toy *t, int chunk) { return toy_stage(t, chunk) == 0; }
static inline int toy_is_last(const toy *t, int chunk) {
    return toy_stage(t, chunk) == t->pp * t->v - 1;
}

static inline void toy_contract_error(toy *t, const char *what, int chunk, int mb) {
    if (t->contract_errors++ == 0)
        snprintf(t->first_error, sizeof t->first_error, "%s (chunk %d, micro-batch %d)", what,
                 chunk, mb);
}

static inline void toy_log(toy *t, char kind, int chunk, int mb, int enable) {
    if (t->n_ev == t->cap_ev) {
        int cap = t->cap_ev ? 2 * t->cap_ev : 64;
        toy_event *ev = (toy_event *)realloc(t->ev, (size_t)cap * sizeof *ev);
        if (!ev) return;
        t->ev = ev;
        t->cap_ev = cap;
    }
    t->ev[t->n_ev].kind = kind;
    t->ev[t->n_ev].chunk = chunk;
    t->ev[t->n_ev].mb = mb;
    t->ev[t->n_ev].enable = enable;
    t->n_ev++;
}

static inline int toy_init(toy *t, int pp, int rank, int v, int m) {
    memset(t, 0, sizeof *t);
    if (v > TOY_MAX_V || pp * v > TOY_MAX_STAGES) return -1;
    t->pp = pp;
    t->rank = rank;
    t->v = v;
    t->m = m;
    t->fail_forward_at = -1;
    for (int c = 0; c < v; c++)
        for (int e = 0; e < TOY_E; e++) {
            t->w[c][e] = toy_weight(toy_stage(t, c), e);
            t->b[c][e] = toy_bias(toy_stage(t, c), e);
        }
    size_t slots = (size_t)v * (size_t)m;
    t->in_ptr = (const float **)calloc(slots, sizeof *t->in_ptr);
    t->in_copy = (float *)calloc(slots * TOY_E, sizeof(float));
    t->out = (float *)calloc(slots * TOY_E, sizeof(float));
    t->first_in = (float *)calloc((size_t)m * TOY_E, sizeof(float));
    if (!t->in_ptr || !t->in_copy || !t->out || !t->first_in) return -1;
    for (int i = 0; i < m; i++)
        for (int e = 0; e < TOY_E; e++) t->first_in[i * TOY_E + e] = toy_input(i, e);
    return 0;
}

static inline void toy_free(toy *t) {
    free(t->in_ptr);
    free(t->in_copy);
    free(t->out);
    free(t->first_in);
    free(t->ev);
    memset(t, 0, sizeof *t);
}

/* Clears gradients, the log and the contract counters (keeps parameters). */
static inline void toy_reset(toy *t) {
    memset(t->dw, 0, sizeof t->dw);
    memset(t->db, 0, sizeof t->db);
    t->n_ev = 0;
    t->n_forward = 0;
    t->n_loss_calls = 0;
    t->contract_errors = 0;
    t->first_error[0] = '\0';
}

static inline int toy_forward(void *app, int chunk, int mb, const float *input, float **output,
                              double *loss_sum, double *num_tokens) {
    toy *t = (toy *)app;
    size_t slot = (size_t)chunk * (size_t)t->m + (size_t)mb;
    const float *x = input;
    float *y = t->out + slot * TOY_E;
    toy_log(t, 'F', chunk, mb, 0);
    if (t->n_forward++ == t->fail_forward_at) return MC_ERR_INVALID_ARG;
    if (toy_is_first(t, chunk) != (input == NULL))
        toy_contract_error(t, input ? "input given on the first virtual stage"
                                    : "input missing on a later virtual stage", chunk, mb);
    if (toy_is_first(t, chunk)) x = t->first_in + (size_t)mb * TOY_E;
    if (x == NULL) return MC_ERR_INVALID_ARG;
    t->in_ptr[slot] = x;
    memcpy(t->in_copy + slot * TOY_E, x, TOY_E * sizeof(float));
    for (int e = 0; e < TOY_E; e++) y[e] = t->w[chunk][e] * x[e] + t->b[chunk][e];
    if (toy_is_last(t, chunk) && t->use_loss_func) {
        *output = y;   /* what the schedule hands to loss_func, never sent */
    } else if (toy_is_last(t, chunk)) {
        double loss = 0.0;
        for (int e = 0; e < TOY_E; e++) loss += 0.5 * (double)y[e] * (double)y[e];
        *loss_sum = loss;
        *num_tokens = TOY_E;
        *output = NULL;
    } else {
        *output = y;
    }
    return MC_OK;
}

static inline int toy_backward(void *app, int chunk, int mb, const float *output_grad,
                               float loss_scale, float **input_grad) {
    toy *t = (toy *)app;
    size_t slot = (size_t)chunk * (size_t)t->m + (size_t)mb;
    const float *x = t->in_ptr[slot], *y = t->out + slot * TOY_E;
    float dy[TOY_E];
    toy_log(t, 'B', chunk, mb, 0);
    if (x == NULL) {
        toy_contract_error(t, "backward before forward", chunk, mb);
        return MC_ERR_STATE;
    }
    if (memcmp(x, t->in_copy + slot * TOY_E, TOY_E * sizeof(float)) != 0)
        toy_contract_error(t, "input changed between forward and backward", chunk, mb);
    if (toy_is_last(t, chunk) != (output_grad == NULL))
        toy_contract_error(t, output_grad ? "output_grad given on the last virtual stage"
                                          : "output_grad missing before the last stage", chunk, mb);
    for (int e = 0; e < TOY_E; e++)
        dy[e] = toy_is_last(t, chunk) ? y[e] * loss_scale : (output_grad ? output_grad[e] : 0.0f);
    for (int e = 0; e < TOY_E; e++) {
        t->dw[chunk][e] += dy[e] * x[e];
        t->db[chunk][e] += dy[e];
        t->grad[e] = dy[e] * t->w[chunk][e];
    }
    t->in_ptr[slot] = NULL;
    *input_grad = t->grad;
    return MC_OK;
}

/* Megatron's loss_func: sum(y^2 / 2) of the output forward_step returned on the last stage. */
static inline int toy_loss_func(void *app, int mb, const float *output, double *loss_sum,
                                double *num_tokens) {
    toy *t = (toy *)app;
    t->n_loss_calls++;
    if (!toy_is_last(t, t->v - 1))
        toy_contract_error(t, "loss_func called below the last stage", t->v - 1, mb);
    if (output != t->out + ((size_t)(t->v - 1) * (size_t)t->m + (size_t)mb) * TOY_E)
        toy_contract_error(t, "loss_func did not get forward_step's output", t->v - 1, mb);
    if (*loss_sum != 0.0 || *num_tokens != 0.0)
        toy_contract_error(t, "loss_func's outputs are not 0 on entry", t->v - 1, mb);
    double loss = 0.0;
    for (int e = 0; e < TOY_E; e++) loss += 0.5 * (double)output[e] * (double)output[e];
    *loss_sum = loss;
    *num_tokens = TOY_E;
    return MC_OK;
}

static inline void toy_grad_sync(void *app, int chunk, int enable) {
    toy_log((toy *)app, 'S', chunk, -1, enable);
}

static inline int toy_finalize(void *app) {
    toy_log((toy *)app, 'Z', 0, -1, 0);
    return MC_OK;
}

static inline mc_schedule_hooks toy_hooks(toy *t, int group_size) {
    mc_schedule_hooks h;
    memset(&h, 0, sizeof h);
    h.app = t;
    h.forward_step = toy_forward;
    h.backward_step = toy_backward;
    h.grad_sync = toy_grad_sync;
    h.finalize = toy_finalize;
    if (t->use_loss_func) h.loss_func = toy_loss_func;
    h.tensor_elems = TOY_E;
    h.group_size = group_size;
    return h;
}

/* The full chain of n_stages virtual stages in one process, no P2P: gradients of every virtual
   stage [n_stages][TOY_E] and the loss sum over micro-batches. */
static inline void toy_reference(int n_stages, int m, float (*dw)[TOY_E], float (*db)[TOY_E],
                                 double *loss_sum) {
    float x[TOY_MAX_STAGES + 1][TOY_E], dy[TOY_E];
    float scale = (float)(1.0 / ((double)TOY_E * (double)m));   /* 1 / (tokens * M) */
    memset(dw, 0, sizeof(float) * TOY_E * (size_t)n_stages);
    memset(db, 0, sizeof(float) * TOY_E * (size_t)n_stages);
    *loss_sum = 0.0;
    for (int i = 0; i < m; i++) {
        double loss = 0.0;
        for (int e = 0; e < TOY_E; e++) x[0][e] = toy_input(i, e);
        for (int s = 0; s < n_stages; s++)
            for (int e = 0; e < TOY_E; e++)
                x[s + 1][e] = toy_weight(s, e) * x[s][e] + toy_bias(s, e);
        for (int e = 0; e < TOY_E; e++) loss += 0.5 * (double)x[n_stages][e] * x[n_stages][e];
        *loss_sum += loss;
        for (int e = 0; e < TOY_E; e++) dy[e] = x[n_stages][e] * scale;
        for (int s = n_stages - 1; s >= 0; s--)
            for (int e = 0; e < TOY_E; e++) {
                dw[s][e] += dy[e] * x[s][e];
                db[s][e] += dy[e];
                dy[e] = dy[e] * toy_weight(s, e);
            }
    }
}

/* The hook calls a correct schedule makes on this stage, from mc_schedule_ops: grad sync off
   for every chunk, then the ops with "S(c,1) B S(c,0)" around each chunk's last micro-batch,
   then finalize; forward_only: the forwards alone. Returns the count, or < 0. */
static inline int toy_expected_events(const toy *t, int group_size, int forward_only,
                                      toy_event *out, int cap) {
    mc_schedule_desc d;
    memset(&d, 0, sizeof d);
    d.pp = t->pp;
    d.pp_rank = t->rank;
    d.num_microbatches = t->m;
    d.vpp = t->v > 1 ? t->v : 0;
    d.group_size = group_size;
    d.forward_only = forward_only;
    int n_ops = mc_schedule_ops(&d, NULL, 0, NULL);
    if (n_ops < 0) return n_ops;
    mc_sched_op *ops = (mc_sched_op *)calloc((size_t)n_ops, sizeof *ops);
    if (!ops) return -1;
    mc_schedule_ops(&d, ops, n_ops, NULL);
    int n = 0;
#define TOY_PUSH(k, c, i, en)                                                     \
    do {                                                                          \
        if (n < cap) {                                                            \
            out[n].kind = (k);                                                    \
            out[n].chunk = (c);                                                   \
            out[n].mb = (i);                                                      \
            out[n].enable = (en);                                                 \
        }                                                                         \
        n++;                                                                      \
    } while (0)
    if (!forward_only)
        for (int c = 0; c < t->v; c++) TOY_PUSH('S', c, -1, 0);
    for (int k = 0; k < n_ops; k++) {
        int last_mb = ops[k].kind == 'B' && ops[k].microbatch == t->m - 1;
        if (last_mb) TOY_PUSH('S', ops[k].chunk, -1, 1);
        TOY_PUSH(ops[k].kind, ops[k].chunk, ops[k].microbatch, 0);
        if (last_mb) TOY_PUSH('S', ops[k].chunk, -1, 0);
    }
    if (!forward_only) TOY_PUSH('Z', 0, -1, 0);
#undef TOY_PUSH
    free(ops);
    return n;
}

/* "F1.0 S0:1 B1.0 S0:0 Z" - an event list as text, for failure messages. */
static inline void toy_events_text(const toy_event *ev, int n, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used + 16 < cap; i++) {
        const char *sep = i ? " " : "";
        if (ev[i].kind == 'S')
            used += (size_t)snprintf(buf + used, cap - used, "%sS%d:%d", sep, ev[i].chunk,
                                     ev[i].enable);
        else if (ev[i].kind == 'Z')
            used += (size_t)snprintf(buf + used, cap - used, "%sZ", sep);
        else
            used += (size_t)snprintf(buf + used, cap - used, "%s%c%d.%d", sep, ev[i].kind,
                                     ev[i].mb, ev[i].chunk);
    }
}

/* Index of the first differing event, or -1 when the lists are equal. */
static inline int toy_events_diff(const toy_event *a, int na, const toy_event *b, int nb) {
    int n = na < nb ? na : nb;
    for (int i = 0; i < n; i++)
        if (a[i].kind != b[i].kind || a[i].chunk != b[i].chunk || a[i].mb != b[i].mb ||
            a[i].enable != b[i].enable)
            return i;
    return na == nb ? -1 : n;
}

#endif /* SCHED_TOY_H_INCLUDED */
