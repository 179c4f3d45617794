/* labs/grader.h - the answer-sheet grader shared by every lab of the megatron_c workbook.

   A lab measures facts (results/labNN.json); the learner writes answers/labNN.md. The grader
   scores the sheet against those facts with the lab's rubric (labs/rubric/labNN.json, whose
   format labs/rubric/SCHEMA.md describes). Each rubric item (a score point of the question)
   earns from three sources, together at most the item's points:

     - predictions (```pred blocks) compared with measured facts: exact, int, enum, bool,
       groups (order-insensitive), set, object fields, numeric with tolerance, interval; they
       count only when the prediction ledger shows them locked, unchanged, by the first
       measured run for the sheet's nonce (see >>ledger);
     - claims: ideas stated in the free text. A claim is a set of relations, each a frame of
       concept slots ("every rank" + "create" + "group") that must stand in one clause or
       within a window of tokens of one sentence, or across a sentence and the one it refers
       back to ("Consider the TP groups. Their members are neighbouring ranks."). Each slot
       has a polarity: negation ("not", "never", "不", "并非") scopes over its clause, denial
       frames ("it is not true that", "a common myth is that", "X is wrong", "误以为",
       "有人认为…其实不然") deny what they frame, and conditionals ("if", "如果") make a
       statement hypothetical. A relation stated with the wrong polarity earns nothing. A
       claim earns where its idea stands, once, wherever the sheet says it;
     - evidence: a measured value quoted in a sentence that says what it is (a group list
       bound to its kind and rank, an outcome bound to its experiment); a dump of numbers
       earns nothing.

   Misconceptions are propositions too (relations such as "collectives are matched by name"):
   one that is asserted voids the sentence that states it (its right keywords earn nothing)
   and costs its penalty once (penalties are capped in total); a denied misconception is a
   correct statement. Sentences that cannot earn: predicate-less bullets and keyword lists,
   restatements of the box's own question, near-duplicates of an earlier sentence, questions,
   filler. A sentence holds at most a few ideas; there is no length bonus and no length cliff.

   Every phrase, rule and threshold lives in the rubric files (the lab's rubric and the shared
   labs/rubric/common/language.json), so a new lab adds data, not code. Grading is
   deterministic and offline (no language model): every awarded or withheld point prints the
   sentence (line + excerpt) and the rule that decided it.

       gr_report rep;
       int rc = gr_grade(&(gr_grade_desc){ .rubric_path = "labs/rubric/lab03.json",
                                           .answers_path = "answers/lab03.md",
                                           .results_path = "results/lab03.json",
                                           .grade_out_path = "results/lab03.grade.json" }, &rep);
       if (rc == 0) printf("%.2f of %.0f\n", rep.total, rep.total_max);
       gr_report_free(&rep);

   Return values: 0 on success, negative (megatron_c status codes) when an input is unusable;
   the printed message then names the file and what to run. A sheet that is not a readable
   UTF-8 text file, or a pred block that gives one key twice, is such an unusable input (the
   message names the file, the line and the key). Nonsense written in valid text is not an
   error: it is graded (and usually scores 0).

   Sentences end at . ! ? 。！？ and at paragraph, list-item and hard line breaks (a semicolon
   joins two statements of one sentence); a soft line break inside a Markdown paragraph is a
   space, so wrapped prose stays one sentence.

   GR_GRADE_DEBUG=1 in the environment prints, on stderr, every sentence with its box, its
   flags and the concepts found in it (+ stated, - denied, ? conditional): for writing rubrics
   and calibration sheets. */
#ifndef GR_GRADER_H_INCLUDED
#define GR_GRADER_H_INCLUDED

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gr_grade_desc {
    const char *rubric_path;    /* "labs/rubric/lab03.json" */
    const char *answers_path;   /* "answers/lab03.md" */
    const char *results_path;   /* "results/lab03.json" */
    const char *ledger_path;    /* "results/lab03.ledger.json"; NULL = next to the results
                                   (gr_ledger_path_for) */
    const char *grade_out_path; /* "results/lab03.grade.json", NULL = do not write */
    FILE *out;                  /* score table goes here; NULL = stdout */
    int quiet;                  /* 1 = print nothing */
} gr_grade_desc;

/* One line of the score table. */
typedef struct gr_item {
    char item[16];     /* the rubric item it belongs to ("M1"), "" for none */
    char id[64];       /* "M1" (the item's total), "M1.dp_size", "FU2.by_sequence", "MC_NAMES" */
    char kind[12];     /* "item" | "pred" | "claim" | "evid" | "misc" */
    char part[12];     /* "main" | "followup" */
    double score;      /* awarded; a misconception that fired has a negative score */
    double max_score;  /* 0 for misconceptions */
    int line;          /* sheet line that decided it, 0 if none */
    int fired;         /* misconceptions: 1 when it fired */
    char *output;      /* why: matched excerpt, what was missing, measured value, ... */
} gr_item;

typedef struct gr_report {
    double main_score, main_max;
    double followup_score, followup_max;
    double total, total_max;
    double penalty_total;    /* sum of applied penalties (positive number, capped) */
    int locked;              /* 1: every prediction written now was locked by the first
                                measured run and is unchanged since */
    int n_pred_unlocked;     /* predictions absent at the first run or changed since (earn 0) */
    int predictions_filled;  /* pred blocks with content beyond the template */
    int near_empty;          /* 1: nothing gradable was written (the "what to do next" case) */
    int check_by_hand;       /* 1: locked predictions mostly wrong, explanations mostly credited:
                                where the grader errs most; the report says what to check */
    char nonce[17];          /* from the results file */
    int probe_rank;
    char variant[8];         /* follow-up variant graded, "F2" */
    int n_items;
    gr_item *items;
} gr_report;

/* Grades; fills *report when non-NULL (free with gr_report_free). The printed table's
   last line is `Total <score>/<max>`. Returns 0 on success, negative on unusable inputs
   (missing results file, bad rubric) with a message naming the file and what to do. */
int gr_grade(const gr_grade_desc *desc, gr_report *report);
void gr_report_free(gr_report *report);

/* ---------------------------------------------------------------------------------------------
   >>ledger  Predict first, for real. A lab calls gr_ledger_lock on world rank 0 at every
   measured run, before it writes its results. The first measured run for a nonce records the
   normalised value (comments and whitespace removed) of every prediction key its pred blocks
   hold; a key still holding a template placeholder ("?", "[[..]]", "ok|hang|...") counts as
   absent. Later runs for that nonce never re-lock: they report how many keys differ from the
   lock. The grader then gives 0 to a prediction that was absent at the lock ("not predicted
   before the first run") or differs from it ("changed since the first run at <time>").

   The ledger is one JSON file per lab ({"format": "megatron_c-prediction-ledger",
   "version": 1, "lab": ..., "nonces": {nonce: {"locked_at", "keys": {"main/dp_size": "2",
   ...}, "runs", "last_run_at", "last_changed"}}}), written atomically (temporary file +
   rename). A ledger that cannot be read or parsed is an error, never silently reset.

   Results files written before the ledger existed (results_format 1: a hash of the pred
   blocks in "predictions") still grade: predictions count when the hash recorded at run time
   matches the sheet now, and earn 0 otherwise. */

#define GR_RESULTS_FORMAT 2     /* results "results_format": 2 = predictions in the ledger */

typedef struct gr_lock_info {
    int locked_now;        /* 1: this call made the lock (first measured run for the nonce) */
    int n_keys;            /* prediction keys in the lock */
    int n_changed;         /* keys that differ from the lock now (added, changed, removed) */
    char locked_at[32];    /* "2026-12-01T09:51:06Z" */
    char message[512];     /* one line for the run's log, or the error */
} gr_lock_info;

/* Locks (first run for the nonce) or checks (later runs) the predictions of answers_path in
   the ledger. ledger_path NULL = results/<lab>.ledger.json (lab from the rubric). Returns 0,
   or negative with info->message saying what is wrong (unreadable or corrupt ledger,
   unusable sheet, bad nonce); the ledger is then left as it was. */
int gr_ledger_lock(const char *ledger_path, const char *rubric_path, const char *answers_path,
                   const char *nonce, gr_lock_info *info);

/* "results/lab03.json" -> "results/lab03.ledger.json" (the ledger next to the results). */
void gr_ledger_path_for(const char *results_path, char *out, size_t cap);

/* Findings: a rubric may list prediction keys (ledger names, "followup/faulty_module") under
   "lock_when_filled": a learner fills them only after looking at runs (a diagnosis). Such a
   key locks at the first measured run that sees it filled (recorded in the entry's
   "late_locks"), and never changes after; the lab keeps the answer hidden until it is
   locked. gr_ledger_locked_value says whether `key` is locked for `nonce`: 1 (its locked
   value copied into value, which may be NULL), 0 (not locked, or no ledger yet), negative
   when the ledger cannot be read (the message on stderr). */
int gr_ledger_locked_value(const char *ledger_path, const char *nonce, const char *key,
                           char *value, size_t cap);

/* Hash of the answer sheet's pred blocks (normalised: whitespace/comments stripped), 16 hex
   chars, and how many pred blocks have any non-template content: the lock record of results
   format 1, still written for older readers. Returns 0, or negative when the sheet cannot be
   read. */
int gr_prediction_hash(const char *answers_path, char hex_out[17], int *n_filled);

/* ---------------------------------------------------------------------------------------------
   >>items  The rubric's items (the seed's score points) as a list, for test runners that
   register one test per item (tests/grade/grade.c). */

typedef struct gr_rubric_item {
    char id[48];         /* "M1" */
    char part[12];       /* "main" | "followup" */
    char title[128];     /* "group/rank mapping" */
    double max_score;
    int is_penalty;      /* a misconception: passes when it does not fire */
} gr_rubric_item;

/* Fills *items (malloc'd, free with free()) with the rubric's items in its order. Returns
   the count (>= 0), or negative when the rubric cannot be used (message on stderr). */
int gr_rubric_items(const char *rubric_path, gr_rubric_item **items);

/* Reads the header comment; returns negative if the sheet is missing or has no header. */
int gr_read_header(const char *answers_path, char nonce_out[17], int *probe_rank,
                         char variant_out[8]);

/* Writes the template for this lab (from the rubric's template data) with the given nonce,
   probe rank and follow-up variant. Refuses (returns 1, writes nothing) when the file exists
   and has content beyond the template, unless force. Returns 0 when written, negative on
   errors (unreadable rubric, unwritable path). */
int gr_write_template(const char *rubric_path, const char *answers_path,
                            const char *nonce, int probe_rank, const char *variant, int force);

#ifdef __cplusplus
}
#endif

#endif /* GR_GRADER_H_INCLUDED */
