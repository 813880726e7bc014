"`reproduce --quick` end to end, and bad observation files through `reproduce_main`."
import json

import pandas as pd
import pytest

from dars_nb.experiments.protocol import available_routers
from dars_nb.experiments.reproduce import reproduce_main


@pytest.fixture
def report(quick_report):
    "The folder of the session's `dars reproduce --quick` report (which must have succeeded)."
    out, res = quick_report
    assert res.returncode == 0, res.stderr[-2000:]
    return out


@pytest.mark.xdist_group('quick_report')   # one worker makes the quick report (conftest), once
def test_quick_writes_the_report(report):
    files = {p.name for p in report.iterdir()}
    for stem in ('table1', 'table1_vs_best_fixed', 'baselines', 'table5', 'table3', 'diagnostics', 'true_regret', 'router_variance', 'sample_efficiency',
                 'beta_sweep', 'temperature', 'adaptive_sampling', 'score_cost', 'table1_vs_paper'):
        assert {f'{stem}.csv', f'{stem}.md'} <= files, stem
    for chart in ('fig2ab_diagnostics', 'fig2c_router_variance', 'fig_protocol', 'fig_ablations', 'fig3_sensitivity'):
        assert {f'{chart}.png', f'{chart}.svg'} <= files, chart
        assert (report / f'{chart}.png').read_bytes()[:4] == b'\x89PNG'
        assert (report / f'{chart}.png').stat().st_size > 1000


@pytest.mark.xdist_group('quick_report')   # one worker makes the quick report (conftest), once
def test_report_mentions_every_router(report):
    text = (report / 'report.md').read_text()
    routers = list(available_routers())
    assert len(routers) == 7
    for name in routers: assert name in text, name
    assert 'True regret' in text and 'DARS is above single-shot in' in text
    for label in ('beats the best fixed model (chosen on training data, interval above 0)',
                  'best fixed model chosen on training data', 'chosen on test, optimistic', 'oracle', 'random'):
        assert label in text, label
    # the paper's protocol by default, and the paper's Table 1 beside the simulator's, said to be the simulator
    assert 'Protocol: `paper`' in text and "### The authors' printout" not in text
    assert 'On the embedded simulator (simulated data, not the paper\'s models), DARS improves' in text
    assert 'of the 42 router–dataset–view settings' in text


@pytest.mark.xdist_group('quick_report')   # one worker makes the quick report (conftest), once
def test_quick_tables_are_complete(report):
    res = pd.read_csv(report / 'protocol_results.csv')
    assert len(res) == 3 * 7 * 2 * 2                     # datasets × routers × {single, dars} × views
    assert res['utility'].notna().all() and res['true_regret'].notna().all()
    assert (res['ci_low'] <= res['utility']).all() and (res['utility'] <= res['ci_high']).all()
    assert set(res.query("supervision == 'single'")['n_draws']) == {10}
    # every row against the best fixed model chosen on training data: one model per dataset, a paired interval
    assert res['vs_best_fixed'].notna().all() and (res.groupby('dataset')['best_fixed'].nunique() == 1).all()
    assert ((res['vs_best_fixed_low'] <= res['vs_best_fixed']) & (res['vs_best_fixed'] <= res['vs_best_fixed_high'])).all()
    base = pd.read_csv(report / 'baselines.csv').set_index(['dataset', 'view', 'policy'])['utility']
    fixed = base.xs('best fixed model (training)', level='policy')
    expected = res['utility'].to_numpy() - fixed.loc[list(zip(res['dataset'], res['view']))].to_numpy()
    assert abs(res['vs_best_fixed'].to_numpy() - expected).max() < 1e-9   # mean of differences = difference of means (CSV keeps 15+ digits)
    # every DARS row against its single-shot twin: the difference of their utilities, inside its paired interval
    keys = ['dataset', 'router', 'view']
    dars, single = (res[res['supervision'] == s].set_index(keys) for s in ('dars', 'single'))
    assert abs(dars['vs_single'] - (dars['utility'] - single['utility'].reindex(dars.index))).max() < 1e-9
    assert ((dars['vs_single_low'] <= dars['vs_single']) & (dars['vs_single'] <= dars['vs_single_high'])).all()
    assert single[['vs_single', 'vs_single_low', 'vs_single_high']].isna().all().all()


def _run(tmp_path, capsys, name, text):
    path = tmp_path / name
    path.write_text(text)
    code = reproduce_main(str(tmp_path / 'out'), data=str(path))
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize('name,text,message', [
    ('missing.csv', 'dataset,split\nd,train\n', 'missing column'),
    ('broken.jsonl', '{not json\n', 'cannot read'),
    ('obs.txt', 'whatever', 'unknown observation file type'),
])
def test_bad_observation_file(tmp_path, capsys, name, text, message):
    code, err = _run(tmp_path, capsys, name, text)
    assert code == 1
    assert len(err.splitlines()) == 1 and 'Traceback' not in err
    assert err.startswith('dars reproduce: error:') and message in err


def test_missing_file_and_missing_features(tmp_path, capsys):
    assert reproduce_main(str(tmp_path / 'out'), data=str(tmp_path / 'nope.parquet')) == 1
    assert 'no observation file' in capsys.readouterr().err
    rows = [dict(dataset='d', split='train', view='grid', query_id='q1', model='m', rewrite_id=1, sample_id=0,
                 score=1.0, cost=0.1)]
    (tmp_path / 'train.jsonl').write_text('\n'.join(json.dumps(r) for r in rows) + '\n')
    assert reproduce_main(str(tmp_path / 'out'), data=str(tmp_path / 'train.jsonl')) == 1
    assert 'no dataset in the file has both a training grid and test observations' in capsys.readouterr().err
    rows.append(dict(rows[0], split='test', view='decode', query_id='q2', rewrite_id=0))
    rows += [dict(r, model='m2') for r in rows]   # two models: the table is routable, only its texts are missing
    (tmp_path / 'obs.jsonl').write_text('\n'.join(json.dumps(r) for r in rows) + '\n')
    code = reproduce_main(str(tmp_path / 'out'), data=str(tmp_path / 'obs.jsonl'))
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert "query_text" in err


@pytest.mark.parametrize('with_data,message', [
    (False, '--features needs --data: a features file describes the queries of an observation file or release folder'),
    (True, 'no features file at nope.parquet'),
])
def test_dars_reproduce_refuses_a_features_file_it_cannot_use_before_any_work(tmp_path, with_data, message):
    "`dars reproduce --quick --features F`: without --data, or F not there, one line and exit 1 at once, nothing written."
    import subprocess, sys
    from pathlib import Path
    from dars_nb.simulate import simulate
    args = ['reproduce', '--out', 'out', '--quick', '--quiet', '--features', 'nope.parquet']
    if with_data:
        simulate('gpqa_like', n_train=20, n_test=10, seed=0)[0].to_parquet(tmp_path / 'obs.parquet')
        args += ['--data', 'obs.parquet']
    res = subprocess.run([str(Path(sys.executable).with_name('dars')), *args], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert res.returncode == 1, (res.returncode, res.stderr[-2000:])
    assert 'Traceback' not in res.stderr and res.stderr.count('\n') == 1, res.stderr
    assert res.stderr.startswith(f'dars reproduce: error: {message}'), res.stderr
    assert not (tmp_path / 'out').exists() and not list(tmp_path.glob('.out.partial-*'))
