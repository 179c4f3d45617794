/* labs/grader.h - the answer-sheet grader shared by every lab of the megatron_c workbook.

   A lab measures facts (results/labNN.json); the learner writes answers/labNN.md. The grader
   scores the sheet against those facts with the lab's rubric (labs/rubric/labNN.json):

     - prediction items (```pred blocks) are compared with measured facts: exact, int, enum,
       bool, groups (order-insensitive), set, object fields, numeric with tolerance, interval;
     - free text is split into sentences and scored by concept groups (English tokens with
       light stemming / prefix match, Chinese by substring after NFKC) that must co-occur in one
       sentence, with negation, one point per sentence, list / copy / density / length rules;
     - misconceptions cost points (each fires at most once, capped in total) and say which
       measured fact refutes them;
     - evidence sections must quote values that this run measured;
     - predictions edited after the run are flagged and halved.

   Every rule and threshold lives in the rubric file, so a new lab adds data, not code.
   Scores are heuristic: no language model is involved, and every awarded or withheld point
   prints the sentence (line number + excerpt) that decided it.

       mc_grade_report rep;
       int rc = mc_grade(&(mc_grade_desc){ .rubric_path = "labs/rubric/lab03.json",
                                           .answers_path = "answers/lab03.md",
                                           .results_path = "results/lab03.json",
                                           .grade_out_path = "results/lab03.grade.json" }, &rep);
       if (rc == 0) printf("%.2f of %.0f\n", rep.total, rep.total_max);
       mc_grade_report_free(&rep);

   Return values: 0 on success, negative (megatron_c status codes) when an input is unusable;
   the printed message then names the file and what to run. Garbage answer sheets are not an
   error: they are graded (and usually score 0).

   Text rules worth knowing when writing a sheet or a rubric:
     - sentences end at . ! ? ; 。！？； and at paragraph, list-item and hard line breaks; a soft
       line break inside a Markdown paragraph is a space, so wrapped prose stays one sentence;
     - commas, colons and parentheses end the reach of a negator;
     - in an evidence section a bracketed list is verified against every measured integer list,
       a stand-alone number against measured scalars and numbers inside measured strings (rank
       ids inside group lists do not verify a bare number); configuration values are ignored.

   MC_GRADE_DEBUG=1 in the environment prints, on stderr, every section's size and density and
   the concepts found in each sentence (for writing rubrics and calibration fixtures). */
#ifndef MC_GRADER_H_INCLUDED
#define MC_GRADER_H_INCLUDED

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mc_grade_desc {
    const char *rubric_path;    /* "labs/rubric/lab03.json" */
    const char *answers_path;   /* "answers/lab03.md" */
    const char *results_path;   /* "results/lab03.json" */
    const char *grade_out_path; /* "results/lab03.grade.json", NULL = do not write */
    FILE *out;                  /* score table goes here; NULL = stdout */
    int quiet;                  /* 1 = print nothing */
} mc_grade_desc;

/* One line of the score table. */
typedef struct mc_grade_item {
    char id[48];       /* rubric id: "P2.tp_groups", "A1.tp_contiguous", "MC1", "A4.evidence" */
    char kind[12];     /* "pred" | "expl" | "misc" | "evid" | "quality" */
    char part[12];     /* "main" | "followup" */
    double score;      /* awarded; a misconception that fired has a negative score */
    double max_score;  /* 0 for misconceptions */
    int line;          /* sheet line that decided it, 0 if none */
    int fired;         /* misconceptions: 1 when it fired */
    char *output;      /* why: matched excerpt, what was missing, measured value, ... */
} mc_grade_item;

typedef struct mc_grade_report {
    double main_score, main_max;
    double followup_score, followup_max;
    double total, total_max;
    double penalty_total;    /* sum of applied penalties (positive number, capped) */
    int locked;              /* 1: predictions were present at run time and unchanged since */
    int predictions_filled;  /* pred blocks with content beyond the template */
    int near_empty;          /* 1: nothing gradable was written (the "what to do next" case) */
    char nonce[17];          /* from the results file */
    int probe_rank;
    char variant[8];         /* follow-up variant graded, "F2" */
    int n_items;
    mc_grade_item *items;
} mc_grade_report;

/* Grades; fills *report when non-NULL (free with mc_grade_report_free). The printed table's
   last line is `Total <score>/<max>`. Returns 0 on success, negative on unusable inputs
   (missing results file, bad rubric) with a message naming the file and what to do. */
int mc_grade(const mc_grade_desc *desc, mc_grade_report *report);
void mc_grade_report_free(mc_grade_report *report);

/* Hash of the answer sheet's pred blocks (normalised: whitespace/comments stripped), 16 hex
   chars, and how many pred blocks have any non-template content. Used by the lab at run
   time. Returns 0, or negative when the sheet cannot be read. */
int mc_grade_prediction_hash(const char *answers_path, char hex_out[17], int *n_filled);

/* Reads the header comment; returns negative if the sheet is missing or has no header. */
int mc_grade_read_header(const char *answers_path, char nonce_out[17], int *probe_rank,
                         char variant_out[8]);

/* Writes the template for this lab (from the rubric's template data) with the given nonce,
   probe rank and follow-up variant. Refuses (returns 1, writes nothing) when the file exists
   and has content beyond the template, unless force. Returns 0 when written, negative on
   errors (unreadable rubric, unwritable path). */
int mc_grade_write_template(const char *rubric_path, const char *answers_path,
                            const char *nonce, int probe_rank, const char *variant, int force);

#ifdef __cplusplus
}
#endif

#endif /* MC_GRADER_H_INCLUDED */
