#!/usr/bin/env python3
"""briefs.py KIT SEED STYLES LAB...  writes the author's and the marker's brief for each lab kit.

KIT    the folder make_kit.sh filled (KIT/<lab>/<id>/{blank.md,run_output.txt,results.json})
SEED   the seed questions file (the twelve questions, their score points, reference analyses),
       or - for the rubric's own record of the seed (its question, follow-up and each item's
       seed wording) with the lab's model answer, answers/reference/<lab>.md
STYLES id=style:lang,... e.g. "h01=fluent but wrong:en,h02=half-right:zh,h03=strong but informal:en"

The author sees only the main question, each sheet's blank template and its run; the marker
sees the seed's whole block, the item list (points, prediction share, each key's partial-credit
rule), the conventions, the sheets, their templates and the runs. Neither sees the rubric.
"""
import json, os, re, sys

BRIEF = {
    'expert': 'An expert: precise, correct, 1-3 sentences per box, quotes the measured values asked for.',
    'strong': 'A strong answer: correct and complete, in natural prose.',
    'strong but informal': 'Understands the topic well and ran the lab carefully: predictions mostly right, '
        'every box answered correctly in short plain sentences, in everyday wording rather than textbook terms, '
        'quoting the measured values the boxes ask for.',
    'terse': 'Correct but as short as possible: one short sentence per box.',
    'verbose': 'Knowledgeable but rambling: long sentences, digressions; the right ideas are in there.',
    'half-right': 'Understands about half: some boxes correct and specific, some vague, some with one real '
        'mistake; predictions right for some keys and wrong for others; quotes a few measured values.',
    'fluent but wrong': 'Confident, well-formed, expert-sounding sentences, but mostly wrong: wrong mechanisms, '
        'reversed responsibilities, wrong predictions, measured values quoted but misread or explained away; the '
        'natural beliefs of someone who half-remembers blog posts, in their own words, not negations of the truth.',
    'learned from the run': 'A learner who filled in every prediction before the run from a naive first guess and '
        'got most of them wrong (the predictions stay exactly as first written: they were locked before the run), '
        'then studied the run output and answered every box correctly from what it measured, in natural sentences, '
        'quoting the measured values the boxes ask for; a box may say what they had expected and what the run '
        'showed instead.',
    'misconceptions in own words': 'States the common misconceptions about this topic as facts, in their own words.',
    'negated truths': 'Writes the true statements but denies them ("it is not true that ...").',
    'keyword bullets': 'Answers every box with bullets of keywords and noun phrases.',
    'prompt copy': 'Restates each box question in slightly different words without answering it.',
    'ideas split across sentences': 'Correct, but every idea is split over two or three very short sentences.',
}
LANG = {'en': 'English', 'zh': 'Chinese (中文)'}

CONVENTIONS = """Marking conventions (apply them exactly):
1. Mark each item out of its points from the seed's score points and the item list. Main question items total 10,
   follow-up items 5; the sheet's total is out of 15. Use steps of 0.05 or coarser.
2. Predictions: treat every filled-in prediction as made before the run. A prediction earns its points only when
   it matches what the run measured; a key with several fields earns by the rule the item list gives for it.
3. Text: a box's text earns the rest of its item's points for the seed ideas it states correctly, as statements
   (a sentence with a predicate). Bullets of bare noun phrases earn nothing; copying the question's or template's
   wording earns nothing; a denied statement does not earn what it denies; repeated sentences count once; filler
   and length earn nothing.
4. Misconceptions: a wrong mechanism or claim costs the idea it is about, and a clear misconception stated as fact
   may cost a little more within that item (never below 0 for the item).
5. Quoted values count only when attributed to the right measured quantity and used correctly (a value misread,
   or explained away as noise when it is the point, earns nothing).
6. An idea written in another box still counts, once, for the item it belongs to.
"""

def seed_blocks(path):
    text = open(path, encoding='utf-8').read()
    return {b[:4]: b.strip() for b in re.split(r'\n(?=M0\d\d\. )', text) if re.match(r'M0\d\d\. ', b)}

def partial_rule(p):
    """The grader's rule for a key (labs/grader.c, gr__judge_*), in the marker's words."""
    t = p.get('type', '')
    if t == 'fields' and p.get('partial'):
        return 'by fields right: ' + ', '.join(f'{n} right earn {s:g} of it' for n, s in p['partial'])
    if t == 'fields':
        return 'all fields right earn all of it, all but one half, fewer nothing'
    if t == 'groups':
        return 'every group exact earns all of it, half of them or more half, fewer nothing'
    tol = []
    if p.get('rel_tol'): tol.append(f"within {100 * p['rel_tol']:g} % of the measured value")
    if p.get('abs_tol'): tol.append(f"within {p['abs_tol']:g} of it")
    return 'all or nothing' + (', right when ' + ' or '.join(tol) if tol else '')

def item_rows(rubric):
    """(id, points or None, title, seed wording, predictions) per item, either rubric schema."""
    if 'items' in rubric:
        return [(it['id'], it['points'], it['title'], it.get('seed', ''), it.get('predictions', []))
                for it in rubric['items']]
    preds = {g['id']: g['items'] for g in rubric.get('predictions', [])}
    return [(s['id'], None, s['title'], '', preds.get(s['id'], [])) for s in rubric['sections']]

def items_text(rubric):
    out = []
    for iid, points, title, seed, preds in item_rows(rubric):
        share = sum(p['points'] for p in preds)
        keys = '; '.join(f"{p['key']} {p['points']:g} ({partial_rule(p)})" for p in preds) or 'none'
        pts = f'{points:g} points' if points is not None else "points as in the box heading"
        out.append(f"{iid} ({pts}) {title}{'; seed: ' + seed if seed else ''}. Predictions carry "
                   f"{share:.2f} of these points: {keys}. The rest is the box text (and quoted values "
                   f"where the template's heading asks for them).")
    return '\n'.join(out) + '\n'

def rubric_seed_block(rubric, lab):
    """The seed as the rubric records it, and the lab's model answer."""
    lines = [rubric.get('seed_question', rubric.get('title', lab)), '',
             'Score points (main 10, follow-up 5):']
    lines += [f'  {iid} {points:g}: {seed or title}' if points is not None else f'  {iid}: {title}'
              for iid, points, title, seed, _ in item_rows(rubric)]
    if rubric.get('seed_followup'): lines += ['', rubric['seed_followup']]
    ref = f'answers/reference/{lab}.md'
    if os.path.exists(ref):
        lines += ['', 'A model answer (graded against another run than yours):', '',
                  open(ref, encoding='utf-8').read()]
    return '\n'.join(lines)

def main():
    kit, seed, styles = sys.argv[1], sys.argv[2], sys.argv[3]
    sheets = [(k, *v.split(':')) for k, v in (s.split('=') for s in styles.split(','))]
    blocks = seed_blocks(seed) if seed != '-' else {}
    open(os.path.join(kit, 'conventions.txt'), 'w').write(CONVENTIONS)
    for lab in sys.argv[4:]:
        d = os.path.join(kit, lab)
        rubric = json.load(open(f'labs/rubric/{lab}.json'))
        block = blocks.get('M%03d' % int(lab[3:])) or rubric_seed_block(rubric, lab)
        open(os.path.join(d, 'seed_block.txt'), 'w').write(block + '\n')
        open(os.path.join(d, 'items.txt'), 'w').write(items_text(rubric))
        learners = '\n'.join(f'- {i}: {st.upper()}, written in {LANG[lg]}. {BRIEF[st]}' for i, st, lg in sheets)
        ids = ', '.join(i for i, _, _ in sheets)
        open(os.path.join(d, 'AUTHOR_TASK.md'), 'w').write(f"""You are writing practice answer sheets for an
interview-preparation workbook, in the role of {len(sheets)} different learners.
The workbook question: {block.splitlines()[0]}
Its follow-up question is the one stated in the "Follow-up" section of each sheet's template.

Read ONLY, for each sheet id in {ids}: {d}/<id>/blank.md (the blank sheet for that learner's nonce) and
{d}/<id>/run_output.txt (what the lab printed when that learner ran it). Open nothing else: you write
without seeing any marking scheme or reference answer. Write the filled-in sheet to {d}/<id>/sheet.md,
keeping the template's headings, header comment and structure; fill in every prediction key as that learner
would have before the run and answer every box in 1-3 sentences; leave the practice box empty.

The learners:
{learners}

Reply with one line per sheet: what that learner gets right and wrong. Do not grade the sheets.
""")
        cols = '\t'.join(row[0] for row in item_rows(rubric))
        open(os.path.join(d, 'MARKER_TASK.md'), 'w').write(f"""You are marking {len(sheets)} practice answer
sheets for an interview-preparation workbook, as an expert examiner in Megatron-LM / Megatron-Core.
Read ONLY: {d}/seed_block.txt (the question, its score points and reference analysis), {d}/items.txt (the items,
their points, each prediction's share and partial-credit rule), {kit}/conventions.txt (apply them exactly), and
for each sheet id in {ids}: <id>/sheet.md, <id>/blank.md and <id>/run_output.txt under {d}. Open nothing else: you
mark without seeing any automatic grader or its rubric.
Write {d}/labels.tsv, tab-separated, header: id\tlabel\t{cols}\tnote, one line per sheet ({lab}-<id>): the total
out of 15 (the sum of the items), each item's mark, and a note of one to four sentences on what earned and why.
""")

if __name__ == '__main__':
    main()
