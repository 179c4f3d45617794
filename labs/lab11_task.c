/* labs/lab11_task.c - lab11's application code: the forward_step and loss_func the library's
   schedule calls. THIS FILE IS YOURS TO EDIT: change a task, rebuild with `make lab11`, run the
   lab again. The schedule (megatron_c.h, mc_get_forward_backward_func) is not recompiled for
   it, and the lab checks every run against the single-rank run of the same code.

   The two tasks below use the same model, the same data and the same schedule; they differ in
   what forward_step asks the model to predict. The helpers are described in lab11_task.h. */
#include <stddef.h>

#include "lab11_task.h"

/* Megatron's get_batch: only the first stage feeds tokens to the model and only the last stage
   needs targets; a stage in between takes its input from the previous stage and reads nothing
   (the data iterator of every stage that reads must stay in step with the others). */
static int read_batch(lab11_app *app, lab11_batch *batch) {
    if (!lab11_is_first_stage(app) && !lab11_is_last_stage(app)) return 0;
    return lab11_get_batch(app, batch);
}

/* Task "lm": next-token prediction, the labels exactly as the dataset gives them. */
static int lm_forward_step(lab11_app *app, int microbatch, const float *input,
                           const float **output) {
    lab11_batch b = {NULL, NULL, 0, 0};
    int rc = read_batch(app, &b);
    if (rc != 0) return rc;
    return lab11_model(app, microbatch, b.tokens, b.labels, input, output);
}

/* The loss: the model returns one cross-entropy loss per token on the last stage; the schedule
   divides the sum by num_tokens and by the number of micro-batches, so report the sum and the
   count (Megatron's (loss, num_tokens) pair), not a mean. */
static int sum_loss_func(lab11_app *app, int microbatch, const float *losses, double *loss_sum,
                         double *num_tokens) {
    int n = lab11_tokens_per_microbatch(app);
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += losses[i];
    *loss_sum = sum;
    *num_tokens = (double)n;
    return 0;
}

/* Task "prev": the same model and data, another target: every position predicts the token
   one step before it (position 0 its own token), built here from the tokens of the batch. */
static int prev_forward_step(lab11_app *app, int microbatch, const float *input,
                             const float **output) {
    lab11_batch b = {NULL, NULL, 0, 0};
    int rc = read_batch(app, &b);
    if (rc != 0) return rc;
    int *target = NULL;
    if (lab11_is_last_stage(app)) {
        int S = b.seq_length, B = b.micro_batch_size;
        target = lab11_target_buffer(app);
        for (int s = 0; s < S; s++)
            for (int j = 0; j < B; j++)
                target[s * B + j] = b.tokens[(s > 0 ? s - 1 : 0) * B + j];
    }
    return lab11_model(app, microbatch, b.tokens, target, input, output);
}

const lab11_task lab11_tasks[2] = {
    {"lm", "the next token (labels[t] = text[t + 1])", lm_forward_step, sum_loss_func},
    {"prev", "the previous token (target[t] = tokens[t - 1])", prev_forward_step, sum_loss_func},
};
