"""Rows off the release's documented schema, on hand-made folders: each read as the authors' loader reads it under
protocol='authors', read with one note of what was assumed by default, and never dropped without a word."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dars_nb.sources.release import RELEASE_FILES, ReleaseError, read_release
from dars_nb.sources import load_observations

MODELS = ('m-b', 'm-a')   # in file order; sorted by name they would be the other way round


def line(split, query, model, pv, decode, score=1.0, cost=0.01, obs_type=None, **extra):
    "One documented line, with the fields the cases below leave out or change given as `extra` (None: left out)."
    rec = dict(dataset='gpqa', split=split, query_id=query, model=model, prompt_variant_id=pv, decode_id=decode,
               input_question=f'{query} asked' if pv < 0 else f'{query} rewrite {pv}', original_question=f'{query} asked',
               score=score, cost=cost, request_config=dict(temperature=0.7, top_p=0.95))
    if split == 'test':
        rec['observation_type'] = obs_type or ('prompt_variation' if pv >= 0 else 'decoding_variation')
    rec.update(extra)
    return {k: v for k, v in rec.items() if v is not None}


def grid(queries=('t1', 't2'), rewrites=2, decodes=2):
    return [line('train', q, m, pv, d, score=float((pv + d) % 2)) for q in queries for m in MODELS
            for pv in range(rewrites) for d in range(decodes)]


def views(queries=('s1',)):
    return [line('test', q, m, pv, d) for q in queries for m in MODELS
            for pv, d in ((0, 0), (1, 0), (-1, 0), (-1, 1))]


def write(folder: Path, train, test) -> Path:
    (folder / 'gpqa').mkdir(parents=True, exist_ok=True)
    for split, rows in (('train', train), ('test', test)):
        (folder / 'gpqa' / RELEASE_FILES[split]).write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return folder


def read(folder, protocol='paper'):
    notes = []
    return read_release(folder, log=notes.append, protocol=protocol), notes


@pytest.mark.timeout(60)
def test_decodes_sharing_one_decode_id_are_kept_as_samples(tmp_path):
    "GPQA's decode view as reported: three temperatures under one decode_id; kept as three samples, said once."
    strategies = (('low_temp', 0.3, 1.0), ('standard', 0.7, 0.0), ('high_temp', 1.0, 0.0))
    test = [line('test', 's1', m, 0, 0) for m in MODELS] + [
        line('test', 's1', m, -1, 0, score=s, decode_strategy=name, request_config=dict(temperature=t, top_p=0.95))
        for m in MODELS for name, t, s in strategies]
    folder = write(tmp_path, grid(), test)
    for protocol in ('paper', 'authors'):
        obs, notes = read(folder, protocol)
        dec = obs[(obs['view'] == 'decode').to_numpy()]
        assert len(dec) == 6 and dec.groupby('model', observed=True)['sample_id'].nunique().eq(3).all()
        assert sorted(dec['strategy'].dropna().unique()) == ['high_temp', 'low_temp', 'standard']
        assert dec.groupby('model', observed=True)['score'].mean().tolist() == [1 / 3, 1 / 3]
        assert notes == ['gpqa/test_scored_generations.jsonl: the decode view has 3 strategies (high_temp, low_temp, '
                         'standard) under one decode_id in 2 cell(s): kept as 3 samples']


@pytest.mark.timeout(60)
def test_the_same_answer_twice_is_refused_by_default_and_kept_under_the_authors_protocol(tmp_path):
    test = views() + [line('test', 's1', 'm-a', -1, 1, score=0.0)]          # decode 1 of m-a again, same settings
    folder = write(tmp_path, grid(), test)
    with pytest.raises(ReleaseError, match="line 9: the same answer as line 8 .*protocol='authors' keeps both"):
        read(folder)
    obs, notes = read(folder, 'authors')
    a = obs[(obs['view'] == 'decode').to_numpy() & (obs['model'] == 'm-a').to_numpy()]
    assert len(a) == 3 and a['sample_id'].tolist() == [0, 1, 2]
    assert notes == ['gpqa/test_scored_generations.jsonl: the decode view has 2 answers under one decode_id in '
                     '1 cell(s): kept as 2 samples']


@pytest.mark.timeout(60)
def test_training_rows_without_ids(tmp_path):
    "Their loader needs neither id on a training row: the rewrite is told by the wording, the decode numbered."
    train = [{**r, 'prompt_variant_id': None, 'decode_id': None} for r in grid()]
    train = [{k: v for k, v in r.items() if v is not None} for r in train]
    folder = write(tmp_path, train, views())
    for protocol in ('paper', 'authors'):
        obs, notes = read(folder, protocol)
        want, _ = read(write(tmp_path / 'documented', grid(), views()))
        key = ['split', 'query_id', 'model', 'rewrite_id', 'sample_id']
        got = obs.astype({c: str for c in key[:3]}).sort_values(key)[key + ['score']].reset_index(drop=True)
        exp = want.astype({c: str for c in key[:3]}).sort_values(key)[key + ['score']].reset_index(drop=True)
        pd.testing.assert_frame_equal(got, exp)
        assert notes[:2] == [
            'gpqa/train_scored_generations.jsonl: 16 rows without prompt_variant_id: the rewrite told by the wording '
            "sent, numbered from 1 (the decode view's: the original question)",
            'gpqa/train_scored_generations.jsonl: 16 rows without decode_id: numbered after the other decodes of their cell']


@pytest.mark.timeout(60)
def test_test_rows_without_ids_where_the_view_suffices(tmp_path):
    test = [{k: v for k, v in r.items() if k not in ('prompt_variant_id', 'decode_id')} for r in views()]
    obs, notes = read(write(tmp_path, grid(), test))
    dec = obs[(obs['view'] == 'decode').to_numpy()]
    assert (dec['rewrite_id'] == 0).all() and dec.groupby('model', observed=True)['sample_id'].nunique().eq(2).all()
    rew = obs[(obs['view'] == 'rewrite').to_numpy()]
    assert rew.groupby('model', observed=True)['rewrite_id'].apply(sorted).tolist() == [[1, 2], [1, 2]]
    assert len(notes) == 2 and all('8 rows without' in n for n in notes)


@pytest.mark.timeout(60)
def test_observation_type_on_some_test_rows_only(tmp_path):
    "Their loader leaves unlabelled rows out of both views when other rows are labelled; ours tells them by the id."
    test = views() + [{k: v for k, v in line('test', 's1', m, 2, 0, score=0.0).items() if k != 'observation_type'}
                      for m in MODELS]
    folder = write(tmp_path, grid(), test)
    ours, notes = read(folder)
    assert (ours['view'] == 'rewrite').sum() == 6 and ours.loc[(ours['rewrite_id'] == 3).to_numpy(), 'view'].eq('rewrite').all()
    assert notes == ['gpqa/test_scored_generations.jsonl: 2 of 10 row(s) without observation_type: the view told by '
                     'prompt_variant_id (≥ 0 rewrite, < 0 decode)']
    theirs, notes = read(folder, 'authors')
    assert (theirs['view'] == 'rewrite').sum() == 4 and not (theirs['rewrite_id'] == 3).any()
    assert notes == ["gpqa/test_scored_generations.jsonl: 2 of 10 row(s) without observation_type: 2 in no view, "
                     "left out, as the authors' loader reads them"]
    # unlabelled and without prompt_variant_id: refused by default, left out under theirs
    bare = test + [{k: v for k, v in line('test', 's1', 'm-a', 3, 0).items() if k not in ('observation_type', 'prompt_variant_id')}]
    with pytest.raises(ReleaseError, match='line 11: neither observation_type nor prompt_variant_id'):
        read(write(tmp_path / 'bare', grid(), bare))
    assert len(read(tmp_path / 'bare', 'authors')[0]) == len(theirs)


@pytest.mark.timeout(60)
def test_a_passage_under_passage(tmp_path):
    test = [{**r, 'passage': 'The Hawks won 21-14.'} for r in views()]
    for protocol in ('paper', 'authors'):
        obs, notes = read(write(tmp_path, grid(), test), protocol)
        test_rows = obs[(obs['split'] == 'test').to_numpy()]
        assert test_rows['passage'].eq('The Hawks won 21-14.').all()
        assert notes == ["gpqa/test_scored_generations.jsonl: 8 rows with the passage under 'passage' (no 'context'): "
                         "read as the passage"]


@pytest.mark.timeout(60)
def test_a_blank_original_question(tmp_path):
    "Blank: read as missing (the query's text from elsewhere) by default; their encoder's fallback under theirs."
    test = [{**r, 'original_question': '   '} for r in views()]
    obs, notes = read(write(tmp_path, grid(), test))
    t = obs[(obs['split'] == 'test').to_numpy()]
    assert t['original_text'].isna().all()
    assert 'no original wording' not in notes and notes[0].startswith('gpqa/test_scored_generations.jsonl: 8 rows with a blank original_question: read as missing')
    from dars_nb.observations import router_texts
    assert router_texts(obs).loc[('gpqa', 's1')] == 's1 asked'          # the wording of its rewrite 0 (the decode view)
    obs, notes = read(tmp_path, 'authors')
    t = obs[(obs['split'] == 'test').to_numpy()]
    assert t['original_text'].eq('s1 rewrite 0').all()                  # the first row's input_question, as theirs
    assert "each query's text from its first row" in notes[0]


@pytest.mark.timeout(60)
def test_a_null_original_question_on_a_query_first_row(tmp_path):
    test = views()
    test[0] = {k: v for k, v in test[0].items() if k != 'original_question'}
    folder = write(tmp_path, grid(), test)
    ours, notes = read(folder)
    assert ours.loc[(ours['split'] == 'test').to_numpy(), 'original_text'].dropna().eq('s1 asked').all()
    assert notes[0].startswith('gpqa/test_scored_generations.jsonl: 1 rows without original_question')
    theirs, _ = read(folder, 'authors')
    from dars_nb.experiments.inputs import authors_texts
    assert authors_texts(theirs).loc[('gpqa', 's1')] == 's1 rewrite 0'   # their encoder reads the first row only


@pytest.mark.timeout(60)
def test_the_protocol_reaches_the_reader_from_load_observations(tmp_path):
    test = views() + [{k: v for k, v in line('test', 's1', m, 2, 0).items() if k != 'observation_type'} for m in MODELS]
    folder = write(tmp_path, grid(), test)
    assert len(load_observations(folder, log=lambda m: None)) == len(load_observations(folder, log=lambda m: None, protocol='authors')) + 2
    with pytest.raises(ReleaseError, match="unknown protocol 'theirs'"):
        load_observations(folder, protocol='theirs')


@pytest.mark.timeout(120)
def test_best_fixed_model_ties_break_by_file_order(tmp_path):
    "Two models tie on the test view's mean score: the authors' code keeps the one its files show first (m-b)."
    from dars_nb.experiments.inputs import load_data
    from dars_nb.experiments.presets import AUTHORS_PROTOCOL, AUTHORS_BASELINES, authors_baselines
    test = [line('test', q, m, pv, d, score=s, cost=c) for q, s in (('s1', 1.0), ('s2', 0.0)) for m, c in
            (('m-b', 0.02), ('m-a', 0.01)) for pv, d in ((0, 0), (1, 0), (-1, 0), (-1, 1))]
    folder = write(tmp_path, grid(), test)
    datasets, _ = load_data(folder, formulas=AUTHORS_PROTOCOL.formulas, log=lambda m: None, reader='authors',
                            text_features=dict(method='tfidf', text='authors'))
    base = authors_baselines(datasets[0]).set_index(['view', 'policy'])
    assert base.loc[('rewrite', AUTHORS_BASELINES[0]), 'model'] == 'm-b'
    assert base.loc[('decode', AUTHORS_BASELINES[0]), 'model'] == 'm-b'


@pytest.mark.timeout(120)
def test_the_data_stage_reads_a_release_under_the_run_protocol(tmp_path):
    "`dars reproduce --protocol authors` reaches the reader: unlabelled test rows are left out, and said so."
    from dars_nb.experiments.inputs import Settings
    from dars_nb.experiments.presets import AUTHORS_PROTOCOL
    from dars_nb.experiments.stages import Run, data_stage
    from dars_nb.routers import KNNRouter
    test = views(('s1', 's2')) + [{k: v for k, v in line('test', 's1', m, 2, 0).items() if k != 'observation_type'}
                                  for m in MODELS]
    folder = write(tmp_path / 'release', grid(('t1', 't2', 't3', 't4')), test)
    features = tmp_path / 'features.csv'          # given, so that no text encoder is loaded
    pd.DataFrame({'query_id': ['t1', 't2', 't3', 't4', 's1', 's2'], 'x': range(6)}).to_csv(features, index=False)
    said = {}
    for protocol in (None, AUTHORS_PROTOCOL):
        run = Run(tmp_path / 'out', Settings(n_train=4), **({} if protocol is None else {'protocol': protocol}))
        logged = []
        run.log = logged.append
        _, datasets, obs = data_stage(run, folder, features, routers={'kNN': KNNRouter(n_neighbors=2)})
        said[run.protocol.name] = (int((obs['split'] == 'test').sum()), [m for m in logged if 'observation_type' in m])
    assert said['paper'][0] == said['authors'][0] + 2
    assert 'the view told by prompt_variant_id' in said['paper'][1][0]
    assert "2 in no view, left out, as the authors' loader reads them" in said['authors'][1][0]


@pytest.mark.timeout(60)
def test_a_cost_only_in_usage(tmp_path):
    "Taken from usage.cost by default, with a note; their loader reads the top-level cost alone and refuses the row."
    test = views()
    test[2] = {**{k: v for k, v in test[2].items() if k != 'cost'}, 'usage': {'cost': 0.02}}
    folder = write(tmp_path, grid(), test)
    ours, notes = read(folder)
    assert ours['cost'].max() == 0.02
    assert notes == ['gpqa/test_scored_generations.jsonl: 1 rows without a top-level cost: usage.cost taken as the cost']
    with pytest.raises(ReleaseError, match='1 row.s. without a finite score or cost .*line 3'):
        read(folder, 'authors')
