"""Ctrl-C is the user's: a library that catches it (scikit-learn's MLP does) must not turn it into a finished,
half-trained router, and a bundle that is not written whole leaves the one that was there."""
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dars_nb.routers.mlp import _fit_regressor
from dars_nb.simulate import simulate
from dars_nb.testing import simulated_texts


def test_ctrl_c_during_an_mlp_fit_reaches_the_caller():
    rng = np.random.default_rng(0)
    Z, y = rng.random((2000, 50)), rng.random((2000, 3))
    params = dict(hidden_layer_sizes=(64,), max_iter=100_000, tol=0.0, n_iter_no_change=100_000, random_state=0)
    previous = signal.signal(signal.SIGUSR1, signal.default_int_handler)   # as Ctrl-C: a KeyboardInterrupt
    ctrl_c = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1))   # while scikit-learn's loop runs
    ctrl_c.start()
    try:
        with pytest.raises(KeyboardInterrupt): _fit_regressor(params, Z, y)
    finally:
        ctrl_c.cancel(); signal.signal(signal.SIGUSR1, previous)


@pytest.fixture(scope='module')
def config(tmp_path_factory):
    "A train config (MLP on 300 simulated queries, about ten seconds of training), its observations beside it."
    folder = tmp_path_factory.mktemp('train')
    obs, features, _ = simulate('math_like', n_train=300, n_test=0, seed=0)
    simulated_texts(obs, features).to_parquet(folder / 'obs.parquet')
    (folder / 'train.toml').write_text('observations = "obs.parquet"\n[router]\nfamily = "MLP"\nmax_iter = 5000\nhidden_layer_sizes = [256, 256]\n'
                                       '[guard]\nenabled = false\n')
    return folder / 'train.toml'


def dars(*args, **kw):
    return subprocess.run([sys.executable, '-m', 'dars_nb', *map(str, args)], capture_output=True, text=True, **kw)


@pytest.mark.parametrize('out, says', [('/dev/null', 'is not a regular file'), ('obs.parquet', 'is an input of the command'),
                                       ('train.toml', 'is an input of the command'), ('new-folder/', 'must name a file')])
def test_train_refuses_an_out_it_must_not_write_before_training(config, out, says):
    before = {p.name: p.read_bytes() for p in config.parent.iterdir() if p.is_file()}
    run = dars('train', config, '--out', out if out.startswith('/') else f'{config.parent}/{out}', timeout=120)
    assert run.returncode == 1 and says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert 'held-out' not in run.stdout   # refused before anything was trained
    assert {p.name: p.read_bytes() for p in config.parent.iterdir() if p.is_file()} == before


@pytest.mark.timeout(300)
def test_ctrl_c_in_training_leaves_the_old_bundle(config):
    old = config.parent / 'old.dars'
    old.write_bytes(kept := b'the bundle of an earlier training')
    # as typed at a terminal: a command started in the background of a script inherits SIGINT ignored
    proc = subprocess.Popen([sys.executable, '-m', 'dars_nb', 'train', str(config), '--out', str(old)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        proc.wait(timeout=3)   # whatever it is doing after three seconds (reading, featurising, fitting)
        pytest.skip('the training ended before the interrupt')
    except subprocess.TimeoutExpired: proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and 'Traceback' not in err, err[-500:]
    assert old.read_bytes() == kept and sorted(p.name for p in config.parent.iterdir()) == ['obs.parquet', 'old.dars', 'train.toml']
