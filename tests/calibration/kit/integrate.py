#!/usr/bin/env python3
"""integrate.py [--split dev|test] KIT STYLES LAB...  adds a marked kit to the corpus
(development sheets by default; --split test adds a blind set to the test halves, which
nothing may be tuned on).

For each lab: KIT/<lab>/labels.tsv (the marker's file) gives the rows; each sheet
(KIT/<lab>/<id>/sheet.md) and its frozen run (run/results.json) are copied to
tests/calibration/<lab>/{sheets,results}/<lab>-<id>.*, and a row is appended to the lab's
labels.tsv with the split (dev unless told), ledger = as_written and the style from STYLES (as for briefs.py).
A sheet already in the corpus is left as it is. The marker's total must equal the sum of the
items. Run from the repository root."""
import shutil, sys

def main():
    args, split = sys.argv[1:], 'dev'
    if args[:1] == ['--split']:
        split, args = args[1], args[2:]
        if split not in ('dev', 'test'):
            sys.exit(f'--split: {split!r} is neither dev nor test')
    kit, styles = args[0], dict(s.split('=') for s in args[1].split(','))
    lang = {'en': 'English', 'zh': '中文'}
    for lab in args[2:]:
        corpus = f'tests/calibration/{lab}'
        rows = [l.rstrip('\n').split('\t') for l in open(f'{kit}/{lab}/labels.tsv', encoding='utf-8') if l.strip()]
        header = open(f'{corpus}/labels.tsv', encoding='utf-8').readline().rstrip('\n').split('\t')
        items = header[3:header.index('ledger')]
        if rows[0][2:2 + len(items)] != items:
            sys.exit(f'{lab}: the marker\'s columns {rows[0][2:2 + len(items)]} are not the items {items}')
        have = open(f'{corpus}/labels.tsv', encoding='utf-8').read()
        added = []
        for r in rows[1:]:
            sid = r[0]
            if f'\n{sid}\t' in have: continue
            sheet = sid.split('-', 1)[1]
            marks = [float(x) for x in r[2:2 + len(items)]]
            if abs(sum(marks) - float(r[1])) > 0.01:
                sys.exit(f'{sid}: the total {r[1]} is not the sum of the items ({sum(marks):g})')
            style, lg = styles[sheet].split(':')
            note = r[2 + len(items)] if len(r) > 2 + len(items) else ''
            added.append('\t'.join([sid, split, f'{sum(marks):g}'] + r[2:2 + len(items)] +
                                   ['as_written', f'{style}, {lang[lg]}', note]))
            shutil.copy(f'{kit}/{lab}/{sheet}/sheet.md', f'{corpus}/sheets/{sid}.md')
            shutil.copy(f'{kit}/{lab}/{sheet}/run/results.json', f'{corpus}/results/{sid}.json')
        with open(f'{corpus}/labels.tsv', 'a', encoding='utf-8') as f:
            if not have.endswith('\n'): f.write('\n')
            f.writelines(a + '\n' for a in added)
        print(f'{lab}: {len(added)} sheets added')

if __name__ == '__main__':
    main()
