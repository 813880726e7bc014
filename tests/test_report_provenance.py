"""The report calls a folder the authors' release only on evidence: their downloader's records, or their documented
files, models and row counts — never a folder dars_nb wrote, however faithful its layout and sizes."""
import json
from pathlib import Path

import pytest

from dars_nb.experiments.report import describe_data, release_evidence
from dars_nb.simulate import simulate
from dars_nb.sources.release import RELEASE_MODELS
from dars_nb.sources.release_writer import write_release


@pytest.fixture(scope='module')
def simulated_gpqa(tmp_path_factory):
    "The simulator at the release's GPQA sizes, named as the release names its dataset and models, written by dars_nb."
    obs = simulate('gpqa_like', n_train=200, n_test=248, seed=3)[0]
    names = dict(zip(sorted(obs['model'].astype(str).unique()), RELEASE_MODELS))
    obs = obs.assign(dataset='gpqa', model=obs['model'].astype(str).map(names),
                     original_text='Question ' + obs['query_id'].astype(str))
    return write_release(obs, tmp_path_factory.mktemp('sim') / 'release')


@pytest.mark.timeout(120)
def test_a_simulator_folder_is_not_called_the_authors_release(simulated_gpqa):
    folder = simulated_gpqa
    assert release_evidence(folder) is None
    said = describe_data(folder)
    assert said == f"a folder in the release layout, `{folder}` (not identified as the authors' release)"


@pytest.mark.timeout(120)
def test_the_documented_counts_identify_the_release_and_one_row_less_does_not(simulated_gpqa, tmp_path):
    "Without dars_nb's mark the same files carry what the authors document; one row short, they do not."
    folder = tmp_path / 'release'
    (folder / 'gpqa').mkdir(parents=True)
    for p in simulated_gpqa.glob('gpqa/*.jsonl'): (folder / 'gpqa' / p.name).write_bytes(p.read_bytes())
    assert release_evidence(folder) == "its files, models and row counts are the ones the authors document"
    assert describe_data(folder) == f"the authors' release `{folder}`"
    test = folder / 'gpqa' / 'test_scored_generations.jsonl'
    test.write_text(''.join(test.read_text().splitlines(keepends=True)[:-1]))
    assert release_evidence(folder) is None and describe_data(folder).startswith('a folder in the release layout')


@pytest.mark.timeout(120)
def test_their_downloader_records_identify_the_release(tmp_path):
    "huggingface_hub's local-dir download leaves a record per file: evidence, whatever the sizes."
    obs = simulate('math_like', n_train=4, n_test=3, seed=1)[0].assign(dataset='math-500')
    folder = write_release(obs, tmp_path / 'data')
    assert release_evidence(folder) is None
    for meta in folder.glob('*/metadata.json'): meta.write_text(json.dumps({'source_repo': 'HuggingFaceH4/MATH-500'}))
    assert release_evidence(folder) is None                      # a source named in metadata proves nothing
    for p in folder.glob('*/*.jsonl'):
        record = folder / '.cache' / 'huggingface' / 'download' / p.parent.name / f'{p.name}.metadata'
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text('3f1c\n"etag"\n1760000000.0\n')
    assert release_evidence(folder) == 'the download records in .cache/huggingface/download'
    assert describe_data(folder).startswith("the authors' release")
    assert release_evidence(folder / 'math-500') is not None     # pointed at one dataset's folder
