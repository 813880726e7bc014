"""The reader of the authors' release against the shipped fixture in its exact format: the mapping row for row,
every refusal (one line naming file, line and field), and the commands that take a release folder."""
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from dars_nb.sources.release import RELEASE_DATASETS, RELEASE_FILES, RELEASE_MODELS, ReleaseError, read_release
from dars_nb.sources.release_writer import write_release
from dars_nb.sources import load_observations

FIXTURE = Path(__file__).resolve().parents[1] / 'data' / 'authors_release'
KEY = ['dataset', 'split', 'query_id', 'model', 'rewrite_id', 'sample_id']


def lines(dataset, split):
    return [json.loads(l) for l in (FIXTURE / dataset / RELEASE_FILES[split]).open(encoding='utf-8')]


@pytest.fixture(scope='module')
def obs():
    return read_release(FIXTURE)


def test_hand_checked_rows(obs):
    "Three lines read by eye, their costs worked out from the tokens and the fixture's made-up prices."
    row = obs.set_index(KEY).sort_index()
    gpqa = row.loc[('gpqa', 'train', 'syn-gpqa-01', 'deepseek/deepseek-chat-v3.1', 1, 0)]
    # prompt_variant_id 0 -> rewrite 1; 88 prompt and 521 completion tokens at $0.27 / $1.10 per million
    assert (gpqa['view'], gpqa['score'], gpqa['prompt_tokens'], gpqa['completion_tokens']) == ('grid', 1.0, 88, 521)
    assert math.isclose(gpqa['cost'], (88 * 0.27 + 521 * 1.10) / 1e6, rel_tol=1e-9)
    assert gpqa['options'] == 'A. It halves\nB. It doubles\nC. It stays the same\nD. It quadruples'
    assert gpqa['query_text'].startswith('In other words: ') and gpqa['kind'] == 'choice' and gpqa['gold'] == 'B'
    math500 = row.loc[('math-500', 'test', 'syn/math/07.json', 'deepseek/deepseek-chat-v3.1', 0, 0)]
    # prompt_variant_id -1 (the original question), observation_type decoding_variation
    assert (math500['view'], math500['score']) == ('decode', 1.0)
    assert math.isclose(math500['cost'], (69 * 0.27 + 750 * 1.10) / 1e6, rel_tol=1e-9)
    assert math500['query_text'] == math500['original_text'] == 'If $f(x) = x^2 - 4x$, what is $f(5)$?'
    assert pd.isna(math500['passage']) and pd.isna(math500['options'])
    drop = row.loc[('drop-800', 'test', 'syn-drop-09', 'google/gemini-2.5-flash-lite', 0, 1)]
    # an answer the scorer could not read: score 0, parse_success false, no predicted answer
    assert (drop['view'], drop['score'], drop['parsed'], drop['gold']) == ('decode', 0.0, False, '41')
    assert pd.isna(drop['answer']) and drop['passage'].startswith('In the season opener the Rivertown Hawks')
    assert math.isclose(drop['cost'], (139 * 0.10 + 137 * 0.40) / 1e6, rel_tol=1e-9)


def test_mapping_row_for_row(obs):
    "Every line of every file has exactly one row, with the line's fields mapped as documented."
    assert len(obs) == 3 * (6 * 6 * 25 + 4 * 6 * 6)
    table = obs.astype({c: str for c in ('dataset', 'split', 'view', 'query_id', 'model')}).set_index(KEY)
    assert table.index.is_unique
    views = {'prompt_variation': 'rewrite', 'decoding_variation': 'decode'}
    for d in RELEASE_DATASETS:
        for split in ('train', 'test'):
            for l in lines(d, split):
                r = table.loc[(d, split, l['query_id'], l['model'], l['prompt_variant_id'] + 1, l['decode_id'])]
                assert r['view'] == ('grid' if split == 'train' else views[l['observation_type']])
                assert (r['score'], r['cost']) == (l['score'], l['cost'])
                assert (r['prompt_tokens'], r['completion_tokens']) == (l['usage']['prompt_tokens'],
                                                                        l['usage']['completion_tokens'])
                assert (r['temperature'], r['top_p']) == (l['request_config']['temperature'],
                                                          l['request_config']['top_p'])
                assert (r['query_text'], r['original_text']) == (l['input_question'], l['original_question'])
                assert (r['passage'] if pd.notna(r['passage']) else None) == l['context']
                assert (r['parsed'], r['generation_key']) == (l['parse_success'], l['generation_key'])
    assert obs.groupby(['dataset', 'query_id'], observed=True)['original_text'].nunique().eq(1).all()
    assert sorted(obs['model'].unique()) == sorted(RELEASE_MODELS)


def copy_fixture(tmp_path, datasets=RELEASE_DATASETS):
    for d in datasets: shutil.copytree(FIXTURE / d, tmp_path / d)
    return tmp_path


def spoil(tmp_path, dataset, split, line_no, change):
    "Rewrite one line of a copied file through `change(dict) -> dict or str`."
    path = tmp_path / dataset / RELEASE_FILES[split]
    text = path.read_text(encoding='utf-8').splitlines()
    new = change(json.loads(text[line_no - 1]))
    text[line_no - 1] = new if isinstance(new, str) else json.dumps(new)
    path.write_text('\n'.join(text) + '\n', encoding='utf-8')


REFUSALS = [  # (line change, message)
    (lambda l: '{"query_id": ', "math-500/train_scored_generations.jsonl line 5: not valid JSON"),
    (lambda l: '[1, 2]', "math-500/train_scored_generations.jsonl line 5: not a JSON object"),
    (lambda l: {**l, 'query_id': ''}, "line 5: field 'query_id' is missing or empty"),
    (lambda l: {k: v for k, v in l.items() if k != 'model'}, "line 5: field 'model' is missing or empty"),
    (lambda l: {**l, 'prompt_variant_id': 'two'}, "line 5: field 'prompt_variant_id' must be an integer, got 'two'"),
    (lambda l: {**l, 'prompt_variant_id': 1.5}, "field 'prompt_variant_id' must be an integer, got 1.5"),
    (lambda l: {**l, 'prompt_variant_id': -3}, "field 'prompt_variant_id' must be at least -1, got -3"),
    (lambda l: {**l, 'decode_id': -1}, "field 'decode_id' must be at least 0, got -1"),
    (lambda l: {**l, 'dataset': 'gpqa'}, "line 5: field 'dataset' is 'gpqa', but the file holds 'math-500'"),
    (lambda l: {**l, 'split': 'test'}, "line 5: field 'split' is 'test', but the file holds 'train'"),
    (lambda l: {**l, 'score': 2}, "line 5: field 'score' must lie in [0, 1], got 2.0"),
    (lambda l: {**l, 'score': 'right'}, "line 5: field 'score' must be a number, got 'right'"),
    (lambda l: {**l, 'cost': -0.001}, "line 5: field 'cost' must not be negative, got -0.001"),
    (lambda l: {**l, 'usage': [1]}, "line 5: field 'usage' must be an object, got list"),
    (lambda l: {**l, 'usage': {**l['usage'], 'prompt_tokens': 'many'}},
     "line 5: field 'usage.prompt_tokens' must be a number, got 'many'"),
    (lambda l: {**l, 'choices': [1, 2]}, "line 5: field 'choices' must be a list of strings"),
    (lambda l: {**l, 'task_type': 'essay'}, "line 5: field 'task_type' is 'essay'"),
    (lambda l: {**l, 'original_question': {'text': 'x'}}, "line 5: field 'original_question' must be a string, got dict"),
    (lambda l: {**l, 'decode_id': 0}, "math-500/train_scored_generations.jsonl line 5: the same answer as line 1"),
]


@pytest.mark.parametrize('change,message', REFUSALS, ids=[m.split(': ', 1)[-1][:40] for _, m in REFUSALS])
def test_each_bad_line_is_refused_with_file_line_and_field(tmp_path, change, message):
    copy_fixture(tmp_path, ['math-500'])
    spoil(tmp_path, 'math-500', 'train', 5, change)
    with pytest.raises(ReleaseError) as e: read_release(tmp_path)
    assert message in str(e.value) and '\n' not in str(e.value)


def test_test_lines_refused(tmp_path):
    copy_fixture(tmp_path, ['gpqa'])
    spoil(tmp_path, 'gpqa', 'test', 3, lambda l: {**l, 'observation_type': 'paraphrase'})
    with pytest.raises(ReleaseError, match=r"gpqa/test_scored_generations.jsonl line 3: field 'observation_type' is "
                                           r"'paraphrase' \(expected one of prompt_variation, decoding_variation\)"):
        read_release(tmp_path)


def test_a_test_file_without_a_view_is_refused(tmp_path):
    copy_fixture(tmp_path, ['gpqa'])
    path = tmp_path / 'gpqa' / RELEASE_FILES['test']
    kept = [l for l in path.read_text().splitlines() if '"decoding_variation"' not in l]
    path.write_text('\n'.join(kept) + '\n')
    with pytest.raises(ReleaseError, match='gpqa/test_scored_generations.jsonl: the decode view is empty'):
        read_release(tmp_path)


def test_the_authors_fallback_without_observation_type(tmp_path):
    "Without observation_type a test line's view follows the sign of prompt_variant_id; the table is the same."
    copy_fixture(tmp_path, ['drop-800'])
    path = tmp_path / 'drop-800' / RELEASE_FILES['test']
    stripped = [{k: v for k, v in json.loads(l).items() if k != 'observation_type'} for l in path.open()]
    path.write_text(''.join(json.dumps(l) + '\n' for l in stripped))
    a, b = read_release(tmp_path), read_release(FIXTURE, datasets=['drop-800'])
    assert a['view'].astype(str).tolist() == b['view'].astype(str).tolist()


def test_cost_falls_back_to_usage_and_strategy_is_kept(tmp_path):
    copy_fixture(tmp_path, ['gpqa'])
    spoil(tmp_path, 'gpqa', 'test', 1, lambda l: {k: v for k, v in l.items() if k != 'cost'})
    spoil(tmp_path, 'gpqa', 'test', 2, lambda l: {**l, 'decode_strategy': 'low_temp',
                                                   'request_config': {**l['request_config'], 'temperature': 0.3}})
    o = read_release(tmp_path, splits=('test',))
    first = json.loads((tmp_path / 'gpqa' / RELEASE_FILES['test']).open().readline())
    assert o['cost'].iloc[0] == first['usage']['cost']
    assert o['strategy'].iloc[1] == 'low_temp' and o['temperature'].iloc[1] == 0.3
    assert o['strategy'].isna().sum() == len(o) - 1


def test_rows_without_a_finite_score_or_cost_are_refused_with_a_count(tmp_path):
    copy_fixture(tmp_path)
    spoil(tmp_path, 'gpqa', 'train', 7, lambda l: {**l, 'score': float('nan')})        # the scorer's NaN
    spoil(tmp_path, 'gpqa', 'train', 9, lambda l: {**l, 'cost': None, 'usage': {**l['usage'], 'cost': None}})
    spoil(tmp_path, 'drop-800', 'test', 4, lambda l: {k: v for k, v in l.items() if k != 'score'})
    with pytest.raises(ReleaseError) as e: read_release(tmp_path)
    assert str(e.value) == ("3 row(s) without a finite score or cost (drop-800/test_scored_generations.jsonl: 1, "
                            "gpqa/train_scored_generations.jsonl: 2; the first is drop-800/test_scored_generations.jsonl "
                            "line 4); drop_incomplete=True drops them")
    said = []
    o = read_release(tmp_path, drop_incomplete=True, log=said.append)
    assert len(o) == 3 * 1044 - 3
    assert said == ["dropped 3 row(s) without a finite score or cost (drop-800/test_scored_generations.jsonl: 1, "
                    "gpqa/train_scored_generations.jsonl: 2)"]


def test_folders_and_files_that_are_not_a_release(tmp_path):
    with pytest.raises(ReleaseError, match='no release folder at'): read_release(tmp_path / 'nope')
    with pytest.raises(ReleaseError, match='no train_scored_generations.jsonl or test_scored_generations.jsonl in'):
        read_release(tmp_path)
    (tmp_path / 'gpqa').mkdir()
    (tmp_path / 'gpqa' / RELEASE_FILES['train']).write_text('\n\n')
    with pytest.raises(ReleaseError, match='gpqa/train_scored_generations.jsonl holds no rows'): read_release(tmp_path)


def test_any_subset_reads(obs):
    part = read_release(FIXTURE, datasets=['gpqa', 'drop-800'], splits=('train',))
    assert sorted(part['dataset'].unique()) == ['drop-800', 'gpqa'] and set(part['view']) == {'grid'}
    assert len(part) == 2 * 900
    one = read_release(FIXTURE / 'math-500')                 # pointed at one dataset's folder
    assert len(one) == 1044 and set(one['dataset']) == {'math-500'}


def test_simulator_round_trip(tmp_path):
    "A simulated table written in the release layout reads back with the same keys, scores and costs."
    from dars_nb.simulate import simulate
    sim, _, _ = simulate('drop_like', n_train=12, n_test=6, seed=3)
    back = read_release(write_release(sim, tmp_path))
    cols = KEY + ['view', 'score', 'cost']
    srt = lambda o: o[cols].astype(str).sort_values(KEY).reset_index(drop=True)
    pd.testing.assert_frame_equal(srt(back), srt(load_observations(sim)))


@pytest.fixture
def dars(capsys):
    "Run the `dars` command in this process: (exit code, stdout, stderr)."
    from dars_nb.cli import main
    def run(*args):
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def test_dars_diagnose_reads_a_release_folder(tmp_path, dars):
    code, out, err = dars('diagnose', FIXTURE, '--quiet')
    assert code == 0, err
    assert all(f'| {d} |' in out for d in RELEASE_DATASETS)
    copy_fixture(tmp_path, ['gpqa'])
    spoil(tmp_path, 'gpqa', 'train', 2, lambda l: {**l, 'score': float('nan')})
    code, out, err = dars('diagnose', tmp_path)
    assert code == 1 and 'Traceback' not in err
    assert err.strip().splitlines() == [
        'dars diagnose: error: 1 row(s) without a finite score or cost (gpqa/train_scored_generations.jsonl: 1; '
        'the first is gpqa/train_scored_generations.jsonl line 2); --drop-incomplete drops them']
    code, out, err = dars('reproduce', '--quick', '--quiet', '--data', tmp_path, '--out', tmp_path / 'report')
    assert code == 1 and err.strip().splitlines()[-1].endswith('line 2); --drop-incomplete drops them'), err
    code, out, err = dars('diagnose', tmp_path, '--drop-incomplete')
    assert code == 0 and '| gpqa |' in out
    assert 'dropped 1 row(s) without a finite score or cost' in err


def test_dars_train_reads_a_release_folder(tmp_path, dars):
    config = tmp_path / 'router.toml'
    config.write_text(f'observations = "{FIXTURE}"\n\n[router]\nfamily = "kNN"\nn_neighbors = 5\n\n'
                      '[features]\nkind = "tfidf"\n')
    code, out, err = dars('train', config, '--out', tmp_path / 'router.zip')
    assert code == 0, err
    assert 'trained kNN on 18 training queries × 6 models' in out
    code, out, err = dars('route', tmp_path / 'router.zip', 'Which organelle makes most of the ATP?')
    assert code == 0 and out.strip() in RELEASE_MODELS


def test_dars_train_names_its_own_way_to_drop_incomplete_rows(tmp_path, dars):
    "`dars train` on a release folder with a row lacking its score: refused with the config key that drops it, then dropped."
    copy_fixture(tmp_path, RELEASE_DATASETS)
    spoil(tmp_path, 'gpqa', 'train', 2, lambda l: {**l, 'score': float('nan')})
    config = tmp_path / 'router.toml'
    body = f'observations = "{tmp_path}"\n\n[router]\nfamily = "kNN"\nn_neighbors = 5\n\n[features]\nkind = "tfidf"\n'
    config.write_text(body)
    code, out, err = dars('train', config, '--out', tmp_path / 'router.zip')
    assert code == 1 and 'Traceback' not in err and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith('line 2); drop_incomplete = true in the config drops them'), err
    config.write_text('drop_incomplete = true\n' + body)
    code, out, err = dars('train', config, '--out', tmp_path / 'router.zip')
    assert code == 0, err
    assert 'dropped 1 row(s) without a finite score or cost (gpqa/train_scored_generations.jsonl: 1)' in out + err


def test_reproduce_reads_a_release_folder(tmp_path):
    "The data stage of `dars reproduce --data FOLDER`: the protocol's datasets, with their test views."
    from dars_nb.experiments.inputs import load_data
    datasets, whole = load_data(FIXTURE, log=lambda m: None)
    assert [d.name for d in datasets] == sorted(RELEASE_DATASETS)
    assert len(whole) == 3 * 1044


# ---- lines an attacker writes: each refused in one line naming the file and the line -------------------------------

def spoil_raw(tmp_path, dataset, split, line_no, change) -> Path:
    "Rewrite one line of a copied file as bytes through `change(line bytes) -> bytes`."
    path = tmp_path / dataset / RELEASE_FILES[split]
    raw = path.read_bytes().split(b'\n')
    raw[line_no - 1] = change(raw[line_no - 1])
    path.write_bytes(b'\n'.join(raw))
    return path


def with_field(name: bytes, value: bytes):
    "A change that writes `name` with the raw JSON `value` right after the line's opening brace."
    return lambda line: b'{"' + name + b'": ' + value + b', ' + line[1:]


RAW_REFUSALS = [  # (change of line 5's bytes, message after "math-500/train_scored_generations.jsonl line 5: ")
    (lambda l: l.replace(b'"decode_id": ', b'"decode_id": ' + b'9' * 4000 + b', "x": '),
     "field 'decode_id' must be at most 2,147,483,646, got 9999"),
    (lambda l: l.replace(b'"decode_id": ', b'"decode_id": ' + b'9' * 5000 + b', "x": '), "a number of more than 4,300 digits"),
    (lambda l: l.replace(b'"decode_id": ', b'"decode_id": 3000000000, "x": '),
     "field 'decode_id' must be at most 2,147,483,646, got 3000000000"),
    (lambda l: l.replace(b'"prompt_tokens": ', b'"prompt_tokens": 1e300, "x": '),
     "field 'usage.prompt_tokens' must be a whole number from 0 to 2,147,483,647, got 1e+300"),
    (lambda l: l.replace(b'"prompt_tokens": ', b'"prompt_tokens": 12.5, "x": '), "field 'usage.prompt_tokens' must be a whole number"),
    (lambda l: (b'"cost": 1' + b'0' * 400 + b', "x": ').join(l.rsplit(b'"cost": ', 1)),   # the top-level cost, read first
     "field 'cost' must be a number a float can hold"),
    (lambda l: l.replace(b'"model": "', b'"model": "\xff', 1), "not UTF-8 (byte"),
    (lambda l: l.replace(b'"query_id": "', b'"query_id": "\\ud800', 1), "the text '\\ud800"),
    (with_field(b'model', b'"google/gemma-3-12b-it"'), "the key 'model' appears twice in one object"),
    (lambda l: l.replace(b'"usage": {', b'"usage": {"cost": 1, ', 1), "the key 'cost' appears twice in one object"),
    (with_field(b'deep', b'[' * 100_000 + b']' * 100_000), "JSON nested too deep"),
    (lambda l: l + b' ' * 2**20, "longer than 1,048,576 bytes, the line limit"),
]


@pytest.mark.parametrize('change,message', RAW_REFUSALS, ids=[m[:40] for _, m in RAW_REFUSALS])
def test_crafted_lines_are_refused_with_file_and_line(tmp_path, change, message):
    "Huge or wrapping numbers, bad bytes, lone surrogates, repeated keys, deep nesting, long lines: one line each."
    copy_fixture(tmp_path, ['math-500'])
    spoil_raw(tmp_path, 'math-500', 'train', 5, change)
    with pytest.raises(ReleaseError) as e: read_release(tmp_path, max_line_mb=1)
    assert f"math-500/train_scored_generations.jsonl line 5: {message}" in str(e.value), str(e.value)
    assert '\n' not in str(e.value)


def test_a_line_is_read_no_further_than_the_limit(tmp_path, monkeypatch):
    "A line of 64 MiB under a 1 MiB limit: refused having read about 1 MiB of it (traced allocations stay under 8 MiB)."
    import tracemalloc
    copy_fixture(tmp_path, ['math-500'])
    spoil_raw(tmp_path, 'math-500', 'train', 2, lambda l: l.replace(b'"output_text": "', b'"output_text": "' + b'x' * 2**26, 1))
    monkeypatch.setenv('DARS_RELEASE_MAX_LINE_MB', '1')
    tracemalloc.start()
    try:
        with pytest.raises(ReleaseError, match='line 2: longer than 1,048,576 bytes'): read_release(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally: tracemalloc.stop()
    assert peak < 8 * 2**20, peak
    assert len(read_release(tmp_path, max_line_mb=65)) == 6 * 6 * 25 + 4 * 6 * 6   # the argument raises the limit


@pytest.mark.parametrize('change,message', [RAW_REFUSALS[i] for i in (0, 3, 6, 7, 8)], ids=['digits', 'tokens', 'bytes', 'surrogate', 'key'])
def test_dars_reproduce_refuses_a_crafted_line_in_one_line(tmp_path, dars, change, message):
    "`dars reproduce --data DIR` on a crafted line: exit 1, one line naming file and line, no traceback."
    copy_fixture(tmp_path / 'release', ['math-500'])
    spoil_raw(tmp_path / 'release', 'math-500', 'train', 5, change)
    code, out, err = dars('reproduce', '--data', tmp_path / 'release', '--out', tmp_path / 'report', '--quick', '--quiet')
    assert code == 1 and 'Traceback' not in err, err
    assert err.strip().splitlines() == [err.strip()] and message in err and 'train_scored_generations.jsonl line 5' in err, err
