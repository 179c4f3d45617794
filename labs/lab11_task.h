/* labs/lab11_task.h - what lab11's application code (labs/lab11_task.c) may call.

   lab11 splits a training run the way Megatron does:
     library (megatron_c.h)   builds this rank's stage of the model (mc_gpt) and runs the
                              pipeline schedule (mc_get_forward_backward_func): which
                              micro-batch runs when on which stage, the P2P between stages,
                              the grad-sync switch, the backward seed 1 / (num_tokens * M);
     lab11.c                  the training loop (the recipe: micro-batch count, optimizer step,
                              consumed samples, the data iterator and its sampler);
     lab11_task.c             forward_step and loss_func: what a task reads from a batch, how
                              the stage model is called, and how its output becomes a loss.
   The schedule calls forward_step on every stage for every micro-batch, and loss_func on the
   last stage only, with the tensor forward_step returned there.

   Shapes: tokens and labels are [S, B] sequence-first (element s * B + b); hidden states are
   [S * B, H]; on the last stage the model returns one loss per token, [S * B]. */
#ifndef LAB11_TASK_H_INCLUDED
#define LAB11_TASK_H_INCLUDED

/* This rank's training state (defined in lab11.c). */
typedef struct lab11_app lab11_app;

/* One micro-batch as the data iterator hands it out (valid until the next lab11_get_batch). */
typedef struct lab11_batch {
    const int *tokens;   /* [S, B] the input tokens */
    const int *labels;   /* [S, B] the dataset's labels: the next token of each position */
    int seq_length;      /* S */
    int micro_batch_size;/* B */
} lab11_batch;

/* Where this rank's stage sits in its pipeline (Megatron's is_pipeline_first/last_stage). */
int lab11_is_first_stage(const lab11_app *app);
int lab11_is_last_stage(const lab11_app *app);

/* next(data_iterator): the next micro-batch of this rank's data-parallel share. Returns 0. */
int lab11_get_batch(lab11_app *app, lab11_batch *batch);

/* The stage model's forward for micro-batch `microbatch` (the id the schedule passed).
   First stage: tokens required, input ignored. Other stages: input (the previous stage's
   output) required. Last stage: labels required; *output = the per-token losses [S * B].
   Other stages: *output = the hidden states [S * B, H] the schedule sends on.
   Returns 0, or a megatron_c status (< 0) with the reason in mc_last_error(). */
int lab11_model(lab11_app *app, int microbatch, const int *tokens, const int *labels,
                const float *input, const float **output);

/* Scratch [S, B] ints owned by the application, for a task that builds its own targets. */
int *lab11_target_buffer(lab11_app *app);

/* Tokens in one micro-batch (S * B). */
int lab11_tokens_per_microbatch(const lab11_app *app);

/* A task: the two callbacks the schedule runs. */
typedef struct lab11_task {
    const char *name;        /* short id: "lm" */
    const char *target;      /* one line: what the model learns to predict */
    /* Megatron's forward_step_func: fetch what this stage needs, run the stage model, return
       its output (*output). Return 0 or a status < 0. */
    int (*forward_step)(lab11_app *app, int microbatch, const float *input,
                        const float **output);
    /* Megatron's loss_func, last stage only: turn forward_step's output into a loss sum and
       the number of tokens it covers. The model's backward weighs every token of the
       micro-batch equally (by 1 / (num_tokens * M)), so a loss that leaves tokens out would
       not match its gradient: sum all S * B per-token losses. */
    int (*loss_func)(lab11_app *app, int microbatch, const float *output, double *loss_sum,
                     double *num_tokens);
} lab11_task;

/* Defined in lab11_task.c: task 0 is the language-model task the faults run with, task 1
   the second task plugged into the same schedule. */
extern const lab11_task lab11_tasks[2];

#endif /* LAB11_TASK_H_INCLUDED */
