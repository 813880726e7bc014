"The `dars` console command, run the way a user runs it: a subprocess, exit codes, no tracebacks."
import json, select, shlex, subprocess, sys
from pathlib import Path

import pytest

from dars_nb.cli import COMMANDS
from dars_command import DARS, run, assert_one_line_error


def test_help_lists_every_command():
    "The installed `dars` script lists every subcommand (each one's `--help` is checked in nbs/90_cli.ipynb)."
    res = run('--help')
    assert res.returncode == 0
    for cmd in COMMANDS: assert f'\n    {cmd} ' in res.stdout or f'\n    {cmd}\n' in res.stdout, cmd
    assert {'reproduce', 'collect', 'diagnose', 'train', 'route', 'serve', 'local'} <= set(COMMANDS)


def test_version_and_python_m():
    from dars_nb import __version__
    for cmd in (DARS, [sys.executable, '-m', 'dars_nb']):
        res = run('--version', cmd=cmd)
        assert res.returncode == 0 and res.stdout.strip() == f'dars {__version__}'


@pytest.mark.parametrize('args', [[], ['no-such-command'], ['reproduce'], ['diagnose'], ['route', 'r.dars', '--lam', 'high'],
                                  ['serve', '--router', 'r.dars'], ['local', '--port', 'eighty']])
def test_usage_error_exits_2(args):
    res = run(*args)
    assert res.returncode == 2, res
    assert 'usage: dars' in res.stderr and 'Traceback' not in res.stderr


@pytest.mark.parametrize('content,problem', [
    (None, 'no observation file'),
    ('{"dataset": "d", "score": 1}\n', 'missing column(s)'),
    ('not json at all\n', 'cannot read'),
])
def test_bad_observation_file_is_one_line_and_exit_1(tmp_path, content, problem):
    path = tmp_path / 'obs.jsonl'
    if content is not None: path.write_text(content)
    res = run('diagnose', str(path))
    assert_one_line_error(res, 'diagnose')
    assert problem in res.stderr


def test_reproduce_bad_file_exit_1(tmp_path):
    res = run('reproduce', '--out', str(tmp_path / 'r'), '--data', str(tmp_path / 'missing.jsonl'))
    assert_one_line_error(res, 'reproduce')
    assert 'no observation file' in res.stderr


@pytest.mark.parametrize('args', [
    ['train', 'missing.toml', '--out', 'r.dars'],
    ['route', 'missing.dars', 'What is 2 + 2?'],
    ['collect', 'missing.toml', '--dry-run'],
])
def test_missing_input_file_is_one_line_and_exit_1(tmp_path, args):
    res = subprocess.run(DARS + args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert_one_line_error(res, args[0])


def test_diagnose_a_real_file(tmp_path):
    from dars_nb.simulate import simulate
    obs, _, _ = simulate('math_like', n_train=40, n_test=10, seed=1)
    path = tmp_path / 'obs.parquet'
    obs.to_parquet(path)
    res = run('diagnose', str(path), '--out', str(tmp_path / 'diag'))
    assert res.returncode == 0, res.stderr
    assert '| dataset |' in res.stdout and 'winner_flip_rate' in res.stdout and 'written:' in res.stdout
    quiet = run('diagnose', str(path), '--out', str(tmp_path / 'diag2'), '--quiet')
    assert quiet.returncode == 0 and 'written:' not in quiet.stdout and '| dataset |' in quiet.stdout
    assert (tmp_path / 'diag2' / 'instability.svg').exists()
    (tmp_path / 'notes.txt').write_text('mine')   # an --out that cannot be a folder: refused before the file is read
    res = run('diagnose', str(tmp_path / 'missing.parquet'), '--out', str(tmp_path / 'notes.txt' / 'diag'))
    assert_one_line_error(res, 'diagnose')
    assert res.stderr.strip().endswith(f'{tmp_path}/notes.txt is a file, not a folder') and res.stdout == ''


def _capped(gb: float):
    "A preexec_fn that caps the child's address space at `gb` GB: an allocation past it fails instead of swapping."
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (int(gb * 2**30), int(gb * 2**30)))


def test_ids_are_bounded_and_far_apart_ids_cost_no_memory(tmp_path):
    """A decode id of 2**31 - 1 (one row of a CSV table) diagnoses under a 3 GB cap (a table as long as the largest id
    took 22 GB); 2**31 and past it, which int32 would wrap around, and a row without its model are refused in one line."""
    from dars_nb.observations import read_observations
    rows = read_observations(Path(__file__).resolve().parents[1] / 'data' / 'local_grid' / 'local_grid.jsonl')
    rows = rows.astype({**{c: str for c in ('dataset', 'split', 'view', 'query_id', 'model')}, 'sample_id': 'int64'})
    first = rows.index[(rows['view'] == 'grid') & (rows['sample_id'] == 0)][0]
    for sample_id, ok in ((2**31 - 1, True), (2**31, False), (2**32 + 1, False)):
        path = tmp_path / f'{sample_id}.csv'
        rows.assign(sample_id=rows['sample_id'].where(rows.index != first, sample_id)).to_csv(path, index=False)
        res = subprocess.run(DARS + ['diagnose', str(path)], capture_output=True, text=True, timeout=600,
                             preexec_fn=_capped(3))
        if ok: assert res.returncode == 0 and '| dataset |' in res.stdout, res.stderr[-2000:]
        else:
            assert_one_line_error(res, 'diagnose')
            assert 'sample_id must be a non-negative integer below 2**31 in every row' in res.stderr
    path = tmp_path / 'no_model.csv'
    rows.assign(model=rows['model'].where(rows.index != first, '')).to_csv(path, index=False)
    res = run('diagnose', str(path))
    assert_one_line_error(res, 'diagnose')
    assert 'model is missing in 1 row(s)' in res.stderr


GRID = Path(__file__).resolve().parents[1] / 'data' / 'local_grid' / 'local_grid.jsonl'


@pytest.mark.parametrize('config, said', [
    ('observations = 5\n', 'observations must be the path of a table or a release folder, got 5'),
    ('pool = 3\n', 'pool must be the path of a pool file (pool = "FILE"), got 3'),
    ('[supervision]\nlam = -1\n', '[supervision] lam must be a finite number >= 0, got -1'),
    ('[supervision]\nbeta = -5\n', '[supervision] beta must be a finite number >= 0, got -5'),
    ('[supervision]\nlam = 1e13\n', '[supervision] lam must be at most 1e+12'),
    ('[supervision]\nseed = -1\n', '[supervision] seed must be an integer from 0 to 2**32 - 1, got -1'),
])
def test_train_refuses_a_bad_setting_before_training(tmp_path, config, said):
    "A setting that would fail later, or make a bundle no command loads, is refused in one line when the config is read."
    lines = {'observations': f'observations = "{GRID}"\n', 'router': '[router]\nfamily = "kNN"\n'}
    key = config.split(' ')[0]
    text = (config if key == 'observations' else lines['observations'] + (config if key == 'pool' else '')) + \
        lines['router'] + (config if config.startswith('[') else '')
    (tmp_path / 'train.toml').write_text(text)
    res = run('train', str(tmp_path / 'train.toml'), '--out', str(tmp_path / 'r.dars'))
    assert_one_line_error(res, 'train')
    assert said in res.stderr and not (tmp_path / 'r.dars').exists()


@pytest.mark.parametrize('tables, said', [
    ('[router]\nfamily = "kNN"\nn_neighbors = "3"\n', "[router] n_neighbors must be an integer, got '3'"),
    ('[router]\nfamily = "kNN"\nn_neighbors = 3.7\n', '[router] n_neighbors must be an integer, got 3.7'),
    ('[router]\nfamily = "kNN"\nn_neighbors = true\n', '[router] n_neighbors must be an integer, got True'),
    ('[router]\nfamily = "kNN"\nn_neighbors = "abc"\n', "[router] n_neighbors must be an integer, got 'abc'"),
    ('[router]\nfamily = "kNN"\neps = nan\n', '[router] eps must be a finite number, got nan'),
    ('[router]\nfamily = "MLP"\nhidden_layer_sizes = "64"\n',
     "[router] hidden_layer_sizes must be an integer or a list of integers, got '64'"),
    ('[router]\nfamily = "kNN"\n[features]\nn_components = "8"\n', "[features] n_components must be an integer, got '8'"),
    ('[router]\nfamily = "kNN"\n[features]\nn_components = 8.5\n', '[features] n_components must be an integer, got 8.5'),
    ('[router]\nfamily = "kNN"\n[guard]\nseed = 1.5\n', '[guard] seed must be an integer, got 1.5'),
])
def test_train_names_the_key_of_a_parameter_of_the_wrong_type(tmp_path, tables, said):
    "A [router], [features] or [guard] value of the wrong type is refused in one line naming its table and key, not coerced."
    (tmp_path / 'train.toml').write_text(f'observations = "{GRID}"\n' + tables)
    res = run('train', str(tmp_path / 'train.toml'), '--out', str(tmp_path / 'r.dars'))
    assert_one_line_error(res, 'train')
    assert said in res.stderr and not (tmp_path / 'r.dars').exists()


def test_train_on_questions_without_words_names_the_column_and_file(tmp_path):
    "Questions whose text holds no word TF-IDF can use are named by their column and file, not by scikit-learn's message."
    from dars_nb.simulate import simulate
    obs, _, _ = simulate('math_like', n_train=20, n_test=5, seed=1)
    obs.assign(original_text='').to_parquet(tmp_path / 'blank.parquet')
    (tmp_path / 'train.toml').write_text('observations = "blank.parquet"\n[router]\nfamily = "kNN"\n')
    res = run('train', str(tmp_path / 'train.toml'), '--out', str(tmp_path / 'r.dars'))
    assert_one_line_error(res, 'train')
    assert (f"the questions' text (original_text) in {tmp_path / 'blank.parquet'} has no word the TF-IDF features "
            "can use") in res.stderr, res.stderr


def test_diagnose_refuses_drop_incomplete_on_a_file(tmp_path):
    "--drop-incomplete drops rows of a release folder; on an observation file it is refused in one line, not ignored."
    from dars_nb.simulate import simulate
    obs, _, _ = simulate('math_like', n_train=20, n_test=5, seed=1)
    obs.to_parquet(tmp_path / 'obs.parquet')
    res = run('diagnose', str(tmp_path / 'obs.parquet'), '--drop-incomplete')
    assert_one_line_error(res, 'diagnose')
    assert f"--drop-incomplete applies to a release folder only, not to the file {tmp_path / 'obs.parquet'}" in res.stderr


def test_reproduce_names_its_own_drop_incomplete(tmp_path):
    "reproduce spells the switch as its user typed it, and refuses it with the simulator rather than ignore it."
    from dars_nb.simulate import simulate
    obs, _, _ = simulate('math_like', n_train=20, n_test=5, seed=1)
    obs.to_parquet(tmp_path / 'obs.parquet')
    res = run('reproduce', '--out', str(tmp_path / 'r'), '--quick', '--data', str(tmp_path / 'obs.parquet'),
              '--drop-incomplete')
    assert_one_line_error(res, 'reproduce')
    assert f"--drop-incomplete applies to a release folder only, not to the file {tmp_path / 'obs.parquet'}" in res.stderr
    res = run('reproduce', '--out', str(tmp_path / 'r'), '--quick', '--drop-incomplete')
    assert_one_line_error(res, 'reproduce')
    assert '--drop-incomplete needs --data' in res.stderr and not (tmp_path / 'r').exists()


def test_train_checks_out_before_training_and_route_bounds_lambda(tmp_path):
    "`--out` in a missing folder is refused before any training; a λ past 1e12 is refused by route in one line."
    config = tmp_path / 'train.toml'
    config.write_text(f'observations = "{GRID}"\n[router]\nfamily = "kNN"\nn_neighbors = 5\n[guard]\nfolds = 4\n')
    res = run('train', str(config), '--out', str(tmp_path / 'no' / 'r.dars'))
    assert_one_line_error(res, 'train')
    assert 'the folder' in res.stderr and 'does not exist' in res.stderr and res.stdout == ''   # nothing trained
    res = run('train', str(config), '--out', str(tmp_path / 'r.dars'), '--quiet')
    assert res.returncode == 0, res.stderr
    res = run('route', str(tmp_path / 'r.dars'), 'What is 12 * 7?', '--lam', '1e308', '--explain')
    assert_one_line_error(res, 'route')
    assert 'lam must be at most 1e+12 (beyond it only cost decides), got 1e+308' in res.stderr
    res = run('route', str(tmp_path / 'r.dars'), 'What is 12 * 7?', '--lam', '1e12')
    assert res.returncode == 0 and res.stdout.strip() in ('smollm2', 'gemma3'), res.stderr
    (tmp_path / 'latin1.txt').write_bytes('Combien font 12 × 7 ?\n'.encode('latin-1'))   # a query file that is not UTF-8
    for file, said in (('/dev/zero', 'query file /dev/zero is not a regular file'),
                       (str(tmp_path / 'latin1.txt'), f'query file {tmp_path}/latin1.txt is not UTF-8 text (byte 16 is 0xd7)')):
        res = run('route', str(tmp_path / 'r.dars'), '--file', file, timeout=120)
        assert_one_line_error(res, 'route')
        assert said in res.stderr, res.stderr



def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    "`dars route --file Q | head -n 2`: two routes, then exit 141 (as `cat | head`), stderr empty; with stdout closed, 0."
    config = tmp_path / 'train.toml'
    config.write_text(f'observations = "{GRID}"\n[router]\nfamily = "kNN"\nn_neighbors = 5\n[guard]\nfolds = 4\n')
    assert run('train', str(config), '--out', str(tmp_path / 'r.dars'), '--quiet').returncode == 0
    questions = tmp_path / 'questions.txt'   # 20,000 routes: far more than a pipe holds (64 KiB)
    questions.write_text(''.join(f'What is {i} * 7?\n' for i in range(20_000)))
    for stderr_too in ('', ' 2>&1'):
        script = f'{shlex.join(DARS)} route {shlex.quote(str(tmp_path / "r.dars"))} --file {shlex.quote(str(questions))}' \
                 f'{stderr_too} | head -n 2; exit "${{PIPESTATUS[0]}}"'
        res = subprocess.run(['bash', '-c', script], capture_output=True, text=True, timeout=300)
        assert res.returncode == 141 and res.stderr == '', (res.returncode, res.stderr)
        assert [line[:9] for line in res.stdout.splitlines()] == ['{"id": 1,', '{"id": 2,'], res.stdout
    res = subprocess.run(['bash', '-c', f'{shlex.join(DARS)} route /no/such.dars "2 + 2?" 2>&1 | head -n 5'],
                         capture_output=True, text=True, timeout=300)
    assert res.stdout.startswith('dars route: error: ') and 'Traceback' not in res.stdout   # a real error still says so
    for args in (['--version'], ['route', str(tmp_path / 'r.dars'), 'What is 2 + 2?']):   # started with stdout closed
        res = subprocess.run(['bash', '-c', f'{shlex.join(DARS + args)} >&-'], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and 'Traceback' not in res.stderr, (res.returncode, res.stderr)


def test_route_reads_standard_input_as_it_arrives(tmp_path):
    "`dars route R --file -` is a filter: a question written to it is routed before its input ends; JSON lines, explained too."
    config = tmp_path / 'train.toml'
    config.write_text(f'observations = "{GRID}"\n[router]\nfamily = "kNN"\nn_neighbors = 5\n[guard]\nfolds = 4\n')
    bundle = str(tmp_path / 'r.dars')
    assert run('train', str(config), '--out', bundle, '--quiet').returncode == 0
    with subprocess.Popen(DARS + ['route', bundle, '--file', '-', '--explain'], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            proc.stdin.write('{"id": "first", "question": "What is 12 * 7?"}\n'); proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 60)   # its input still open: the route comes anyway
            assert ready, 'no route within 60 s of the first question, with standard input still open'
            first = json.loads(proc.stdout.readline())
            out, err = proc.communicate('Name the capital of France.\n\n"a JSON string"', timeout=60)
        finally: proc.kill()
    assert proc.returncode == 0 and err == '', (proc.returncode, err)
    rest = [json.loads(line) for line in out.splitlines()]   # every line is JSON, the explanation inside it
    assert [first['id']] + [r['id'] for r in rest] == ['first', 2, 4]   # ids count lines, a blank one too
    for r in [first] + rest:
        assert r['model'] == r['models'][0]['model'] and {m['model'] for m in r['models']} == {'smollm2', 'gemma3'}
        assert set(r['models'][0]) == {'model', 'mu_q', 'mu_c', 'sigma', 'utility'} and r['guard']
    bad = subprocess.run(DARS + ['route', bundle, '--file', '-'], input=b'What is 2 + 2?\nfor\xeat\n',
                         capture_output=True, timeout=120)
    assert bad.stdout.decode().splitlines() == [json.dumps({'id': 1, 'model': json.loads(bad.stdout)['model']})]
    res = subprocess.CompletedProcess(bad.args, bad.returncode, bad.stdout.decode(), bad.stderr.decode())
    assert_one_line_error(res, 'route')   # what came before the bad line is routed; the bad line is named
    assert 'standard input line 2 is not UTF-8 text (byte 3 of the line is 0xea)' in res.stderr
    res = subprocess.run(['bash', '-c', f'{shlex.join(DARS)} route {shlex.quote(bundle)} --file - <&-'],
                         capture_output=True, text=True, timeout=120)
    assert_one_line_error(res, 'route')   # started with standard input closed
    assert 'standard input is closed' in res.stderr

@pytest.mark.xdist_group('quick_report')
def test_reproduce_quiet_shows_no_progress_bar(quick_report):
    "The console script's `reproduce --quick --quiet` (its report is checked in tests/test_reproduce.py)."
    _, res = quick_report
    assert res.returncode == 0, res.stderr[-2000:]
    assert '%|' not in res.stderr    # no progress bar: stderr is not a terminal, and --quiet


COLLECT_BASE = '''rewriter = "m1"
[models.m1]
base_url = "http://127.0.0.1:9/v1"
price_in = 1.0
price_out = 1.0
[collection]
store = "s.sqlite"
output = "o.parquet"
data_dir = "{data}"
[[datasets]]
'''
MATH = '{"query_id": "%s", "kind": "math", "question": "%s", "gold": "3"}\n'


@pytest.mark.parametrize('dataset,tasks,said', [
    ('source = "mmlu"\ntrain = 2\ntest = 2\noptions = { subjects = [] }\n', None,
     '[[datasets]] #1 (mmlu): options.subjects is an empty list'),
    ('path = "t.jsonl"\ntrain = 1\ntest = 1\n', MATH % ('a', '   ') + MATH % ('b', '1 + 2?'),
     "t.jsonl line 1: field 'question' is blank"),
    ('source = "t.jsonl"\ntrain = 1\ntest = 1\n', None,
     '''source 't.jsonl' is a file name: source names a loader (expected one of mmlu, math500, math, drop, gpqa); '''
     '''a JSONL task file of your own goes under path (path = "t.jsonl")'''),
])
def test_collect_dry_run_names_a_bad_dataset(tmp_path, dataset, tasks, said):
    "A dataset the run would refuse or misread is refused by the dry run in one line, naming the field or the line."
    (tmp_path / 'c.toml').write_text(COLLECT_BASE.format(data=Path(__file__).resolve().parents[1] / 'data') + dataset)
    if tasks is not None: (tmp_path / 't.jsonl').write_text(tasks)
    res = run('collect', str(tmp_path / 'c.toml'), '--dry-run')
    assert_one_line_error(res, 'collect')
    assert said in res.stderr, res.stderr


def test_collect_dry_run_of_a_short_task_file_gives_the_run_s_advice(tmp_path):
    "A task file with fewer questions than train + test: the dry run's note is the run's error, not the data folder's advice."
    (tmp_path / 'c.toml').write_text(COLLECT_BASE.format(data=tmp_path) + 'path = "t.jsonl"\ntrain = 1\ntest = 1\n')
    (tmp_path / 't.jsonl').write_text(MATH % ('a', '1 + 2?'))
    dry, real = run('collect', str(tmp_path / 'c.toml'), '--dry-run'), run('collect', str(tmp_path / 'c.toml'))
    assert dry.returncode == 0, dry.stderr
    assert_one_line_error(real, 'collect')
    error = real.stderr.split('error: ', 1)[1].strip()
    assert f'note: {error}; this plan prices 2 with repeats' in dry.stdout and '--data' not in dry.stdout, dry.stdout


def test_a_file_for_a_folder_and_no_local_model_are_named(tmp_path):
    "`dars collect --data FILE` says the file is not a folder; `dars local --models ''` names the option and the models."
    (tmp_path / 'c.toml').write_text(COLLECT_BASE.format(data=tmp_path) + 'source = "math500"\ntest = 2\n')
    (tmp_path / 'sim.parquet').write_bytes(b'PAR1')
    res = run('collect', str(tmp_path / 'c.toml'), '--dry-run', '--data', str(tmp_path / 'sim.parquet'))
    assert_one_line_error(res, 'collect')
    assert f"data folder '{tmp_path / 'sim.parquet'}' is a file, not a folder" in res.stderr, res.stderr
    res = run('local', '--models', '')
    assert_one_line_error(res, 'local')
    assert '--models names no model: give one or more of smollm2, gemma3' in res.stderr, res.stderr
