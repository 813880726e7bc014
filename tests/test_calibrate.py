"""`dars calibrate` prints a λ that routes as it reports: on the local grid (a guarded kNN bundle on 32 questions, two
models) and on the shipped LLMRouter table (a bundle trained with `dars train`, targets on its 450 test questions)."""
import contextlib
import io
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dars_nb.testing import forced_test_flags

ROOT = Path(__file__).resolve().parents[1]
from dars_command import DARS_SCRIPT as DARS
NEMOTRON, GEMMA = 'llama-3.1-nemotron-51b-instruct', 'gemma-2-9b-it'
# the LLMRouter bundle trains on 5,160 questions (about 20 s alone, up to 2 minutes on 2 busy cores): its tests run
# with DARS_TEST_FLAGS=slow; the local grid's check the same properties in `make test`


def slow(test):
    "`test`, run only with DARS_TEST_FLAGS=slow."
    return pytest.mark.slow(pytest.mark.skipif('slow' not in forced_test_flags(), reason='slow: set DARS_TEST_FLAGS=slow')(test))


def report_of(router, **target) -> str:
    "What `dars calibrate ROUTER` prints for a target, run in this process."
    from dars_nb.bundle.calibrate import calibrate_main
    with contextlib.redirect_stdout(io.StringIO()) as out: calibrate_main(str(router), **target)
    return out.getvalue()


def printed(report: str) -> tuple:
    "The λ and model name a report prints, the plateau it names, and its table: questions per model."
    lam, name = re.search(r"^λ = (\S+) \(dars serve --lam \1, or ask for the model (\S+)\)$", report, re.M).groups()
    ends = re.search(r"^every λ from (\S+) to (\S+) routes these questions alike", report, re.M)
    rows = report.split('\n\n')[1].splitlines()[1:]
    return lam, name, ends and ends.groups(), {r.split()[0]: int(r.split()[-1]) for r in rows}


def routed_counts(bundle, questions, lam: float) -> dict:
    "Questions per model when `bundle.route` routes `questions` at λ."
    counts = pd.Series(bundle.route(questions, lam)).value_counts()
    return {m: int(counts.get(m, 0)) for m in bundle.models}


def check_routes_as_printed(bundle, questions, report: str) -> None:
    "The printed λ, and the λ the printed model name carries, route every model's reported number of questions."
    from dars_nb.bundle.model_name import lambda_from_model_name
    lam, name, ends, counts = printed(report)
    assert lambda_from_model_name(name) == (True, float(lam)), report
    assert routed_counts(bundle, questions, float(lam)) == counts, report
    if ends: assert float(ends[0]) <= float(lam) <= float(ends[1]), report


@pytest.fixture(scope='module')
def local_grid(tmp_path_factory):
    "The guarded kNN bundle of data/local_grid/router.toml, and its training questions (also in a query file beside it)."
    from dars_nb.bundle import load_bundle
    path = tmp_path_factory.mktemp('local_grid') / 'local.router'
    res = subprocess.run([DARS, 'train', str(ROOT / 'data/local_grid/router.toml'), '--out', str(path), '--quiet'],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    bundle = load_bundle(path)
    # the training questions as a query file: `--file` routes them with the router itself (in-sample)
    path.with_suffix('.jsonl').write_text(''.join(json.dumps({'question': q}) + '\n' for q in bundle.meta['train_texts']))
    return path, bundle, bundle.meta['train_texts']


def on_training_questions(path) -> dict:
    "`report_of`'s `file` for the local grid's training questions (the default is those questions held out)."
    return dict(file=str(path.with_suffix('.jsonl')))


@pytest.mark.parametrize('target', [dict(model='smollm2', share=1.0), dict(model='smollm2', share=0.5),
                                    dict(model='gemma3', share=0.3), dict(model='gemma3', share=0.41),
                                    dict(model='gemma3', share=0.0), dict(cost=0.000001), dict(cost=0.000004)])
def test_local_grid_routes_as_printed(local_grid, target):
    "On the local grid the printed λ and model name route the reported questions per model (the λ of 100 % to smollm2 routed 59 % before)."
    path, bundle, questions = local_grid
    check_routes_as_printed(bundle, questions, report_of(path, **on_training_questions(path), **target))


def test_local_grid_default_is_the_training_questions_held_out(local_grid):
    "Without --file the report is about the training questions held out: its table is what the fold routers route at its λ."
    from dars_nb.bundle.calibrate import HeldOutOutcomes
    from dars_nb.bundle import read_questions
    path, bundle, questions = local_grid
    assert read_questions(path.with_suffix('.jsonl'))[1] == questions     # the query file holds the questions as kept
    report = report_of(path, model='gemma3', share=0.3)
    assert report.startswith(f"target: 30.0% of requests to gemma3, on the {len(questions)} training questions, held out"), report
    lam, _, _, counts = printed(report)
    held = HeldOutOutcomes(bundle).choice(float(lam))
    assert counts == {m: int((held == k).sum()) for k, m in enumerate(bundle.models)}, report


def test_local_grid_notes_read_in_the_order_of_lambda(local_grid):
    "A jump note names two different λ, the lower first, each routing the share it names; an out-of-reach note is λ = 0 first."
    path, bundle, questions = local_grid
    report = report_of(path, **on_training_questions(path), model='gemma3', share=0.3)
    lo, hi, before, after = re.search(r"between λ = (\S+) and (\S+) it jumps from [\d.]+% to [\d.]+% \((\d+) to (\d+) "
                                      r"questions", report).groups()
    assert float(lo) < float(hi), report
    assert [routed_counts(bundle, questions, float(l))['gemma3'] for l in (lo, hi)] == [int(before), int(after)], report
    far = report_of(path, **on_training_questions(path), model='smollm2', share=0.5)
    at_zero, top_share, top = re.search(r"out of reach: it is ([\d.]+)% at λ = 0 and ([\d.]+)% at λ = (\S+)\n", far).groups()
    assert [round(100 * routed_counts(bundle, questions, lam)['smollm2'] / len(questions), 1) for lam in (0.0, float(top))] \
        == [float(at_zero), float(top_share)], far
    cost = report_of(path, **on_training_questions(path), cost=0.000004)
    before, after = re.search(r"between λ = \S+ and \S+ it jumps from \$([\d.]+) to \$([\d.]+)", cost).groups()
    assert float(before) > float(after), cost      # the cost falls as λ grows


def test_fast_scan_routes_as_bundle_route(local_grid):
    "The block scan chooses, question by question, the model `bundle.route` chooses, at the middle of many plateaus."
    import numpy as np
    from dars_nb.bundle.calibrate import RouteOutcomes, lambda_grid, plateau
    _, bundle, questions = local_grid
    out = RouteOutcomes(bundle, questions)
    grid = lambda_grid(out)
    middles = [sum(plateau(out, lam, grid)) / 2 for lam in grid[::4]] + [bundle.lam]   # its own λ: the stored margin
    for lam, row in zip(middles, out.choices(middles)):
        assert [bundle.models[k] for k in row] == bundle.route(questions, lam), lam
    assert len({tuple(r) for r in out.choices(middles)}) > 1 and np.isfinite(middles).all()


def test_calibrate_command_prints_the_lambda_alone(local_grid):
    "`dars calibrate --quiet` prints the λ of the full report; a model it does not route to is a one-line error."
    path, _, _ = local_grid
    res = subprocess.run([DARS, 'calibrate', str(path), '--model', 'gemma3', '--share', '0.3', '--quiet'],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout == printed(report_of(path, model='gemma3', share=0.3))[0] + '\n'
    bad = subprocess.run([DARS, 'calibrate', str(path), '--model', 'gpt-5', '--share', '0.5'],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and 'Traceback' not in bad.stderr
    assert bad.stderr.startswith("dars calibrate: error: model 'gpt-5' is not one the router chooses from")


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


@slow
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
    check_routes_as_printed(bundle, questions, report)
    if abs(cal.achieved - share) <= 1 / n: return
    j = cal.jump
    (lo, hi), (before, after) = j.lam, j.value
    assert min(before, after) < share < max(before, after), report
    assert hi - lo <= 1e-7 * hi and abs(after - before) > 2 / n, report
    assert 'note: no λ comes closer' in report


@slow
@pytest.mark.parametrize('target', [dict(model=NEMOTRON, share=0.573), dict(model=GEMMA, share=0.5),
                                    dict(model='codegemma-7b', share=1.0), dict(cost=0.0002), dict(cost=0.00005)])
def test_llmrouter_routes_as_printed(llmrouter, target):
    "`dars calibrate --file` on the LLMRouter test questions: the printed λ and model name route the reported table."
    from dars_nb.bundle import load_bundle
    path, file, questions = llmrouter
    check_routes_as_printed(load_bundle(path), questions, report_of(path, file=str(file), **target))


@slow
def test_calibrate_command_and_serving_the_lambda(llmrouter):
    "The CLI prints the λ; routing at that λ gives exactly the share the report gives."
    from dars_nb.bundle import load_bundle
    path, file, questions = llmrouter
    res = subprocess.run([DARS, 'calibrate', str(path), '--file', str(file), '--model', NEMOTRON, '--share', '0.7',
                          '--quiet'], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    lam, _, _, counts = printed(report_of(path, file=str(file), model=NEMOTRON, share=0.7))
    assert res.stdout == lam + '\n'
    assert load_bundle(path).route(questions, float(lam)).count(NEMOTRON) == counts[NEMOTRON]
    assert abs(counts[NEMOTRON] / len(questions) - 0.7) <= 1 / len(questions)


@slow
def test_fast_scan_routes_as_bundle_route_on_llmrouter(llmrouter):
    "Nine models, a guard whose best fixed model and margin move with λ: the block scan still routes as `bundle.route`."
    from dars_nb.bundle import load_bundle
    from dars_nb.bundle.calibrate import RouteOutcomes, lambda_grid, plateau
    path, _, questions = llmrouter
    bundle = load_bundle(path)
    out = RouteOutcomes(bundle, questions)
    grid = lambda_grid(out)
    middles = [sum(plateau(out, lam, grid)) / 2 for lam in grid[::6]]   # each `route` predicts afresh: 3 s
    for lam, row in zip(middles, out.choices(middles)):
        assert [bundle.models[k] for k in row] == bundle.route(questions, lam), lam
    assert len({tuple(r) for r in out.choices(middles)}) > 4


@slow   # torch and a guard's cross-validation: about 20 s on 2 busy cores
def test_policy_router_prints_a_lambda_of_its_guard_grid():
    "RM-Softmax's guard is known on a grid of λ only: the printed λ is one of them, exactly, and routes as reported."
    from dars_nb.bundle.calibrate import Target, calibrate, describe_calibration
    from dars_nb.bundle.training import train
    from dars_nb.simulate import simulate
    from dars_nb.testing import simulated_texts, SMALL_ROUTERS
    obs, feats, _ = simulate('gpqa_like', n_train=60, n_test=0, seed=0)
    bundle = train(dict(observations=simulated_texts(obs, feats), guard=dict(folds=2),
                        router=dict(family='RM-Softmax', random_state=0, **SMALL_ROUTERS['RM-Softmax'])), quiet=True)
    questions = bundle.meta['train_texts']
    cheap = bundle.models[int(np.argmin(bundle.meta['mean_cost_usd']))]
    with warnings.catch_warnings():
        warnings.simplefilter('error', RuntimeWarning)   # its μ_q is unknown: not a "mean of empty slice"
        cal = calibrate(bundle, questions, Target(share=0.5, model=cheap))
        text = describe_calibration(bundle, cal)
    assert float(cal.text) in bundle.guard_cv.parts['lams'].tolist()
    assert 'expected quality: not predicted' in text and not re.search(r'\bnan\b', text), text
    check_routes_as_printed(bundle, questions, text)
