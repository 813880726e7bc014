"""Write the synthetic fixture in the layout of the paper authors' released scored generations.

Every row is made up here (questions, passages, options, answers, scores, token counts, prices):
nothing comes from the real release. The shape is the release's: six models, per training query
5 rewrites x 5 decodes, per test query 3 rewrites x 1 decode and 3 decodes of the original.

Run from the repository root:  python data/authors_release/make_release.py [--out data/authors_release]
"""
import argparse
from pathlib import Path
import numpy as np
import pandas as pd
from dars_nb.sources.release import RELEASE_MODELS
from dars_nb.sources.release_writer import MAX_TOKENS, write_release
from dars_nb.observations import format_options
from dars_nb.scoring import score_drop

# USD per million prompt / completion tokens (made-up round figures of the right order)
PRICES = dict(zip(RELEASE_MODELS, [(0.05, 0.10), (0.10, 0.30), (0.10, 0.30), (0.13, 0.40), (0.10, 0.40),
                                   (0.27, 1.10)]))
# answer length (completion tokens) per model: a short answerer, a talker, ...
LENGTHS = dict(zip(RELEASE_MODELS, [220, 380, 600, 260, 300, 420]))
LONGER = {'choice': 1.0, 'math': 1.6, 'reading': 0.4}   # answer length by task kind
REWRITES = ["In other words: {q}", "{q} Answer carefully.", "Consider the following. {q}",
            "Here is a question for you: {q}", "Restated: {q}"]

CHOICE = [  # (stem, options, gold letter, category)
    ("A sealed rigid tank of gas is heated from 300 K to 600 K. By what factor does its pressure change?",
     ["It halves", "It doubles", "It stays the same", "It quadruples"], 'B', 'Physics'),
    ("Which of these molecules has a trigonal planar shape?", ["NH3", "H2O", "BF3", "CH4"], 'C', 'Chemistry'),
    ("A cell is placed in a solution with a higher solute concentration than its cytoplasm. What happens first?",
     ["Water leaves the cell", "Water enters the cell", "The cell divides", "Nothing changes"], 'A', 'Biology'),
    ("Two resistors of 4 ohm and 12 ohm are joined in parallel. What is the combined resistance?",
     ["16 ohm", "8 ohm", "3 ohm", "0.33 ohm"], 'C', 'Physics'),
    ("Which reagent turns a primary alcohol into an aldehyde without going on to the acid?",
     ["Potassium permanganate", "PCC", "Sodium borohydride", "Water"], 'B', 'Chemistry'),
    ("Which organelle makes most of a eukaryotic cell's ATP?",
     ["Ribosome", "Golgi body", "Lysosome", "Mitochondrion"], 'D', 'Biology'),
    ("A ball is dropped from rest. Ignoring air, how far does it fall in the first 2 seconds (g = 10 m/s^2)?",
     ["10 m", "20 m", "40 m", "5 m"], 'B', 'Physics'),
    ("What is the oxidation state of manganese in KMnO4?", ["+2", "+4", "+6", "+7"], 'D', 'Chemistry'),
    ("Which base pairs with adenine in DNA?", ["Thymine", "Cytosine", "Guanine", "Uracil"], 'A', 'Biology'),
    ("A wave has frequency 50 Hz and wavelength 4 m. What is its speed?",
     ["12.5 m/s", "54 m/s", "200 m/s", "46 m/s"], 'C', 'Physics'),
]
MATH = [  # (problem, answer, subject)
    ("What is the remainder when $7^{12}$ is divided by $5$?", '1', 'Number Theory'),
    ("Solve for $x$: $3x + 7 = 22$.", '5', 'Algebra'),
    ("How many ways can 4 different books be arranged on a shelf?", '24', 'Counting & Probability'),
    ("What is the area of a circle of radius $3$? Express your answer in terms of $\\pi$.", '9\\pi', 'Geometry'),
    ("Compute $\\frac{2}{3} + \\frac{1}{6}$.", '\\frac{5}{6}', 'Prealgebra'),
    ("What is the sum of the interior angles of a hexagon, in degrees?", '720', 'Geometry'),
    ("If $f(x) = x^2 - 4x$, what is $f(5)$?", '5', 'Algebra'),
    ("What is the greatest common divisor of $84$ and $126$?", '42', 'Number Theory'),
    ("A fair coin is tossed 3 times. What is the probability of exactly two heads?", '\\frac{3}{8}',
     'Counting & Probability'),
    ("Find the positive solution of $x^2 = 49$.", '7', 'Algebra'),
]
PASSAGES = [
    "The harbour town of Merrow grew quickly after 1820. In 1821 it had 400 residents; by 1830 the "
    "number had reached 1,150, and a second pier was built in 1832. The fishing fleet counted 18 boats "
    "in 1825 and 31 boats in 1835, when a storm destroyed 6 of them.",
    "In the season opener the Rivertown Hawks beat the Lakeside Owls 27 to 20. The Hawks scored two "
    "touchdowns in the first quarter, the Owls answered with a field goal, and the only points of the "
    "fourth quarter were a 41-yard field goal by the Hawks' kicker, Dana Reyes.",
]
READING = [  # (passage index, question, gold answers, category)
    (0, "How many residents did Merrow gain between 1821 and 1830?", ['750'], 'number'),
    (0, "In which year was the second pier built?", ['1832'], 'date'),
    (0, "How many boats were left after the storm of 1835?", ['25'], 'number'),
    (0, "Which was larger, the fleet of 1825 or the fleet of 1835?", ['the fleet of 1835', '1835'], 'span'),
    (0, "How many years after 1820 was the second pier built?", ['12'], 'number'),
    (1, "Who kicked the field goal in the fourth quarter?", ['Dana Reyes'], 'span'),
    (1, "By how many points did the Hawks win?", ['7'], 'number'),
    (1, "Which team scored first?", ['the Rivertown Hawks', 'Hawks'], 'span'),
    (1, "How long was the fourth-quarter field goal, in yards?", ['41'], 'number'),
    (1, "How many touchdowns did the Hawks score in the first quarter?", ['2', 'two'], 'number'),
]

def queries() -> pd.DataFrame:
    "One row per query of the three datasets: id, kind, texts, gold answer, category."
    rows = [dict(dataset='gpqa', query_id=f'syn-gpqa-{i:02d}', kind='choice', original_text=s,
                 options=format_options(o), gold=g, category=c) for i, (s, o, g, c) in enumerate(CHOICE, 1)]
    rows += [dict(dataset='math-500', query_id=f'syn/math/{i:02d}.json', kind='math', original_text=p, gold=a,
                  category=c) for i, (p, a, c) in enumerate(MATH, 1)]
    rows += [dict(dataset='drop-800', query_id=f'syn-drop-{i:02d}', kind='reading', original_text=q,
                  passage=PASSAGES[p], gold=' | '.join(g), category=c) for i, (p, q, g, c) in enumerate(READING, 1)]
    return pd.DataFrame(rows)

def cells(n_train: int = 6) -> pd.DataFrame:
    "Every (query, model, rewrite, decode) of the release's shape: the first n_train queries of each dataset train."
    out = []
    for q in queries().to_dict('records'):
        split = 'train' if int(q['query_id'].split('-')[-1].split('/')[-1].split('.')[0]) <= n_train else 'test'
        grid = ([('grid', n, j) for n in range(1, 6) for j in range(5)] if split == 'train' else
                [('rewrite', n, 0) for n in range(1, 4)] + [('decode', 0, j) for j in range(3)])
        out += [dict(q, split=split, view=v, model=m, rewrite_id=n, sample_id=j)
                for m in RELEASE_MODELS for v, n, j in grid]
    return pd.DataFrame(out)

def observations(seed: int = 0) -> pd.DataFrame:
    "The synthetic observation table: scores from a made-up per-(query, model) success rate, costs from tokens."
    rng = np.random.default_rng(seed)
    obs = cells()
    pair = obs.groupby(['dataset', 'query_id', 'model'], sort=False).ngroup().to_numpy()
    rate = rng.beta(2, 1.5, pair.max() + 1)[pair]
    hit = rng.random(len(obs)) < rate
    obs['score'] = hit.astype(float)
    obs['answer'] = None
    drop = (obs['kind'] == 'reading').to_numpy()           # DROP's F1 is continuous: partial credit sometimes,
    partial = drop & ~hit & (rng.random(len(obs)) < 0.3)    # for a right answer with words around it
    golds = obs.loc[partial, 'gold'].str.split(' | ', regex=False)
    obs.loc[partial, 'answer'] = [g[0] + ' or so' for g in golds]
    obs.loc[partial, 'score'] = [score_drop(f'Final Answer: {a}', g) for a, g in zip(obs.loc[partial, 'answer'], golds)]
    wording = [o if n == 0 else REWRITES[n - 1].format(q=o) for o, n in zip(obs['original_text'], obs['rewrite_id'])]
    obs['query_text'] = wording
    obs['prompt_tokens'] = [len(t) // 4 + len(p) // 4 + 60 if isinstance(p, str) else len(t) // 4 + 60
                            for t, p in zip(wording, obs['passage'])]
    mean = obs['model'].map(LENGTHS).to_numpy() * obs['kind'].map(LONGER).to_numpy()
    cap = obs['kind'].map(MAX_TOKENS).to_numpy()
    wanted = np.maximum(8, rng.normal(mean, mean / 5)).astype(int)
    obs['completion_tokens'] = np.minimum(wanted, cap)
    obs['finish_reason'] = np.where(wanted >= cap, 'length', 'stop')   # an answer cut at the cap
    price = np.array([PRICES[m] for m in obs['model']])
    obs['cost'] = np.round((obs['prompt_tokens'] * price[:, 0] + obs['completion_tokens'] * price[:, 1]) / 1e6, 10)
    obs['parsed'] = rng.random(len(obs)) > 0.03
    obs.loc[~obs['parsed'] | (obs['finish_reason'] == 'length'), 'parsed'] = False
    obs.loc[~obs['parsed'], ['score', 'answer']] = [0.0, None]   # an answer the scorer cannot read scores 0
    obs['temperature'], obs['top_p'] = 0.7, 0.95
    return obs

def main(out: str = str(Path(__file__).parent)):
    obs = observations()
    write_release(obs, out, source='synthetic rows written by data/authors_release/make_release.py')
    print(f"wrote {len(obs)} rows to {out}")

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', default=str(Path(__file__).parent))
    main(p.parse_args().out)
