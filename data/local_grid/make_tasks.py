"""Write the two task files of the local grid and, optionally, store their template rewrites.

    python make_tasks.py                       # sums.jsonl and compare.jsonl (numpy default_rng, seed 0)
    python make_tasks.py --store STORE.sqlite  # also store three template rewrites per query (rewriter 'template')
    python make_tasks.py --originals local_grid.jsonl   # add each query's original_text and options to a table

The rewrites come from fixed templates, not from a language model: the local models' own rewrites
of these questions were mostly off-task (see README.md). `dars collect` uses rewrites already in its
store and asks its rewriter only for missing ones, so with the store filled first no rewriter call is made.
"""
import json
import sys
import numpy as np

SUM_TEMPLATES = ('Compute {a} + {b}.', 'Add {a} and {b}. What do you get?', 'What is the sum of {a} and {b}?')
COMPARE_TEMPLATES = ('Which of {a} and {b} is the bigger number?', 'Of the two numbers {a} and {b}, which is greater?',
                     'Pick the larger number: {a} or {b}.')

def sum_tasks(n: int, rng) -> list[dict]:
    "`n` questions 'What is a + b?' with a, b drawn uniformly from 1..9 (free-form number answers)."
    ab = rng.integers(1, 10, size=(n, 2))
    return [dict(query_id=f'sum{i:03d}', kind='math', question=f'What is {a} + {b}?', gold=str(a + b), a=a, b=b)
            for i, (a, b) in enumerate(ab.tolist())]

def compare_tasks(n: int, rng) -> list[dict]:
    "`n` questions 'Which number is larger: a or b?' with two different two-digit numbers as options A and B."
    out = []
    for i in range(n):
        a, b = rng.choice(np.arange(10, 100), size=2, replace=False).tolist()
        out.append(dict(query_id=f'cmp{i:03d}', kind='choice', question=f'Which number is larger: {a} or {b}?',
                        choices=[str(a), str(b)], gold='A' if a > b else 'B', a=a, b=b))
    return out

def template_rewrites(task: dict, rng) -> list[str]:
    "Three rewrites of `task` from its kind's templates, in an order drawn from `rng`."
    templates = SUM_TEMPLATES if task['kind'] == 'math' else COMPARE_TEMPLATES
    return [templates[j].format(a=task['a'], b=task['b']) for j in rng.permutation(len(templates))]

def write(path: str, rows: list[dict]):
    with open(path, 'w') as f: f.writelines(json.dumps({k: v for k, v in r.items() if k not in 'ab'}) + '\n' for r in rows)

def add_originals(path: str):
    "Give every row of a collected table its query's `original_text` and `options` from the task files, line by line."
    import pandas as pd
    from dars_nb.collect.tasks import load_task_file
    from dars_nb.collect.run import with_query_columns
    tasks = pd.concat([load_task_file('sums.jsonl', 'sums'), load_task_file('compare.jsonl', 'compare')])
    rows = [json.loads(l) for l in open(path)]
    keys = pd.DataFrame({'dataset': [r['dataset'] for r in rows], 'query_id': [r['query_id'] for r in rows]})
    added = with_query_columns(keys, tasks)
    with open(path, 'w') as f:
        for r, (_, a) in zip(rows, added.iterrows()):
            extra = {c: (None if pd.isna(a[c]) else a[c]) for c in ('original_text', 'passage', 'options')}
            f.write(json.dumps({**r, **extra}, ensure_ascii=False) + '\n')

if __name__ == '__main__':
    if '--originals' in sys.argv:
        add_originals(sys.argv[sys.argv.index('--originals') + 1])
        sys.exit(0)
    rng = np.random.default_rng(0)
    sums, compare = sum_tasks(60, rng), compare_tasks(60, rng)
    write('sums.jsonl', sums)
    write('compare.jsonl', compare)
    if '--store' in sys.argv:
        from dars_nb.collect.store import Store
        store = Store(sys.argv[sys.argv.index('--store') + 1])
        for dataset, tasks in (('sums', sums), ('compare', compare)):
            for t in tasks:
                for i, text in enumerate(template_rewrites(t, rng), 1): store.put_rewrite(dataset, t['query_id'], i, text, model='template')
        store.close()
