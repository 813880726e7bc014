"""Damaged stores: 50 random page corruptions, a truncated file, salvage.

Every corruption must give one line on stderr and exit code 1 — never a traceback — from `dars collect` (a run and a dry
run), `dars status` and `dars store check`, and must leave the damaged file byte for byte as it was.
"""
import hashlib
import json
import random
import shutil
from pathlib import Path


from dars_nb.collect.command import collect_main
from dars_nb.collect.store import Store, store_main, status_main, salvage_store
from dars_nb.observations import example_observations

PAGE = 4096


def _store(path: Path) -> Path:
    "A store with observations, rewrites, rewriter answers, a ledger and meta, spread over a few dozen pages."
    obs = example_observations()
    with Store(path) as s:
        s.insert_many(obs.assign(response=['answer ' * 60] * len(obs)).to_dict('records'))
        for i in range(200):
            s.put_rewrite('d', f'q{i}', 1, f'rewrite of query {i} ' * 5, model='r')
            s.put_rewriter_answer('d', f'q{i}', 1, [1], f'<rewrite>rewrite of query {i}</rewrite>', model='r')
            led = s.ledger()
            led.settle(led.reserve('m', 'generation', 1e-5), 5e-6, 'ok')
        s.set_meta('plan', {'planned': [['d', 'm', 3]]})
    return path


def _config(tmp_path: Path, store: Path) -> Path:
    tasks = tmp_path / 'tasks.jsonl'
    tasks.write_text(''.join(json.dumps(dict(query_id=f'q{i}', kind='math', question=f'{i} + {i}?', gold=str(2 * i))) + '\n'
                             for i in range(4)))
    cfg = tmp_path / 'collect.toml'
    cfg.write_text('rewriter = "m"\n[models.m]\nbase_url = "http://127.0.0.1:9/v1"\n'
                   f'[collection]\nstore = "{store.name}"\n[[datasets]]\npath = "tasks.jsonl"\ntrain = 2\ntest = 1\n')
    return cfg


def _digest(p: Path) -> str: return hashlib.sha256(p.read_bytes()).hexdigest()


def _one_line_error(capsys, code, prefix):
    out, err = capsys.readouterr()
    assert code == 1, (code, out, err)
    assert err.count('\n') == 1 and err.startswith(prefix) and 'Traceback' not in err, err
    return err


def test_fifty_random_page_corruptions_are_one_line_and_no_write(tmp_path, capsys):
    sound = _store(tmp_path / 'sound.sqlite')
    pages = sound.stat().st_size // PAGE
    assert pages >= 20
    rng = random.Random(14)
    db = tmp_path / 'store.sqlite'
    cfg = _config(tmp_path, db)
    for trial in range(50):
        for p in tmp_path.glob('store.sqlite*'): p.unlink()
        shutil.copy(sound, db)
        raw = bytearray(db.read_bytes())
        page = rng.randrange(pages)
        raw[page * PAGE:(page + 1) * PAGE] = rng.randbytes(PAGE)
        db.write_bytes(bytes(raw))
        digest = _digest(db)
        err = _one_line_error(capsys, collect_main(str(cfg), dry_run=True), 'dars collect: error: ')
        assert 'dars store salvage' in err, (trial, page, err)
        _one_line_error(capsys, collect_main(str(cfg)), 'dars collect: error: ')
        _one_line_error(capsys, status_main(str(db)), 'dars status: error: ')
        _one_line_error(capsys, store_main('check', str(db)), 'dars store: error: ')
        assert _digest(db) == digest, (trial, page)
        # whatever the damage, salvage never fails and never writes to the damaged file
        out = tmp_path / f'salvaged{trial}.sqlite'
        salvage_store(db, out)
        assert _digest(db) == digest
        out.unlink()


def test_a_truncated_store_is_not_a_new_store(tmp_path, capsys):
    db = _store(tmp_path / 'store.sqlite')
    db.write_bytes(b'')
    cfg = _config(tmp_path, db)
    for run in (lambda: collect_main(str(cfg), dry_run=True), lambda: collect_main(str(cfg))):
        err = _one_line_error(capsys, run(), 'dars collect: error: ')
        assert 'is an empty file (0 bytes), not a store' in err
    assert db.stat().st_size == 0


def test_salvage_copies_every_readable_row(tmp_path, capsys):
    sound = _store(tmp_path / 'sound.sqlite')
    with Store(sound) as s: n = s.count()
    hurt = tmp_path / 'hurt.sqlite'
    raw = bytearray(sound.read_bytes())
    raw[12 * PAGE:13 * PAGE] = random.Random(0).randbytes(PAGE)
    hurt.write_bytes(bytes(raw))
    assert store_main('salvage', str(hurt), str(tmp_path / 'new.sqlite')) == 0
    assert 'new store:' in capsys.readouterr().out
    assert store_main('check', str(tmp_path / 'new.sqlite')) == 0
    with Store(tmp_path / 'new.sqlite') as s:
        got = s.count()
        assert s.ledger().spent()[0] > 0 or s._q('SELECT COUNT(*) FROM rewrites')[0][0] > 0
    assert 0 < got <= n
    assert store_main('salvage', str(hurt)) == 1              # --out is required
    assert 'salvage needs --out' in capsys.readouterr().err
