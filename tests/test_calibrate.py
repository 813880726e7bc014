"`dars calibrate` on the shipped LLMRouter table: a bundle trained with `dars train`, targets on its 450 test questions."
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dars_nb.testing import forced_test_flags

ROOT = Path(__file__).resolve().parents[1]
DARS = str(Path(sys.executable).with_name('dars'))
NEMOTRON, GEMMA = 'llama-3.1-nemotron-51b-instruct', 'gemma-2-9b-it'
# about 2 minutes on 2 cores (the training alone, 5,160 questions): run with DARS_TEST_FLAGS=slow; the notebook
# nbs/25e_calibrate.ipynb checks the same properties on a hand-made and a simulated router in `make test`
pytestmark = [pytest.mark.slow, pytest.mark.skipif('slow' not in forced_test_flags(),
                                                   reason='slow: set DARS_TEST_FLAGS=slow')]


@pytest.fixture(scope='module')
def llmrouter(tmp_path_factory):
    "A guarded kNN bundle on the LLMRouter training split (TF-IDF, 128 SVD dims), and the test questions."
    from dars_nb.sources.importers import read_llmrouter
    tmp = tmp_path_factory.mktemp('llmrouter')
    read_llmrouter(ROOT / 'data' / 'routing' / 'llmrouter').to_parquet(tmp / 'obs.parquet')
    (tmp / 'train.toml').write_text('observations = "obs.parquet"\n[router]\nfamily = "kNN"\nn_neighbors = 10\n'
                                    '[features]\nkind = "tfidf"\nn_components = 128\n')
    res = subprocess.run([DARS, 'train', str(tmp / 'train.toml'), '--out', str(tmp / 'llm.router'), '--quiet'],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(l) for l in (ROOT / 'data/routing/llmrouter/test.jsonl').read_text().splitlines()]
    (tmp / 'test.jsonl').write_text(''.join(json.dumps({'id': i, 'question': l['question']}) + '\n'
                                            for i, l in enumerate(lines)))
    return tmp / 'llm.router', tmp / 'test.jsonl', [l['question'] for l in lines]


@pytest.mark.parametrize('model,share', [(NEMOTRON, 0.7), (NEMOTRON, 0.5), (NEMOTRON, 0.3), (GEMMA, 0.3), (GEMMA, 0.8)])
def test_share_within_one_question_wherever_a_lambda_gives_it(llmrouter, model, share):
    """The share `calibrate` reaches is within one question of the target, or the target lies in a jump of the
    share: two λ closer than 10⁻⁷ (relative) on either side of it, where many questions move at once."""
    from dars_nb.bundle import load_bundle
    from dars_nb.bundle.calibrate import Target, calibrate, describe_calibration
    path, _, questions = llmrouter
    bundle = load_bundle(path)
    cal = calibrate(bundle, questions, Target(share=share, model=model))
    n = len(questions)
    report = describe_calibration(bundle, cal)
    if abs(cal.achieved - share) <= 1 / n: return
    j = cal.jump
    (lo, hi), (before, after) = j.lam, j.value
    assert min(before, after) < share < max(before, after), report
    assert hi - lo <= 1e-7 * hi and abs(after - before) > 2 / n, report
    assert 'note: no λ comes closer' in report


def test_calibrate_command_and_serving_the_lambda(llmrouter):
    "The CLI prints the λ; routing at that λ gives the share it promised."
    from dars_nb.bundle import load_bundle
    path, file, questions = llmrouter
    res = subprocess.run([DARS, 'calibrate', str(path), '--file', str(file), '--model', NEMOTRON, '--share', '0.7',
                          '--quiet'], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    lam = float(res.stdout)
    chosen = load_bundle(path).route(questions, lam)
    assert abs(np.mean([m == NEMOTRON for m in chosen]) - 0.7) <= 1 / len(questions)
    bad = subprocess.run([DARS, 'calibrate', str(path), '--model', 'gpt-5', '--share', '0.5'],
                         capture_output=True, text=True, timeout=900)
    assert bad.returncode == 1 and 'Traceback' not in bad.stderr
    assert bad.stderr.startswith("dars calibrate: error: model 'gpt-5' is not one the router chooses from")
