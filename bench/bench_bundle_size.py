"""The largest router bundle the seven families make at RouterBench size: the figure the bundle reader's
default cap (`dars_nb.bundle.format.DEFAULT_MAX_MB`) is set from.

Run: .venv/bin/python bench/bench_bundle_size.py [--train 30000] [--models 11] [--width 384]

The dataset is `simulate(widen('gpqa_like', 11), n_train)` (the one `bench_scale.py` runs the protocol on). The
features are random unit rows of `--width` columns, the width of the sentence encoder that `features = "auto"`
picks for real text: a bundle's size depends on the shapes of what it holds, never on the values, so the
families are fitted for one epoch / iteration (`max_iter=1`, `epochs=1`, `n_init=1`) and the guard's
cross-validation uses 2 folds (its arrays are (queries, models) whatever the number of folds). Each bundle is
saved with the sentence featurizer and guard data, as `dars train` saves it; printed per family: the file size,
the bytes its members decompress to (what the reader's cap counts), the manifest's bytes and the member count."""
import argparse, tempfile, time, zipfile, warnings
from pathlib import Path
import numpy as np
from sklearn.exceptions import ConvergenceWarning

from dars_nb.simulate import simulate, widen
from dars_nb.stats import supervision
from dars_nb.routers import ROUTERS
from dars_nb.bundle.guard import cross_validate
from dars_nb.features import SentenceFeaturizer
from dars_nb.bundle import RouterBundle, save_bundle
from dars_nb.bundle.format import DEFAULT_MAX_MB

QUICK = {'MLP': dict(max_iter=1), 'MIRT': dict(epochs=1), 'EmbedLLM': dict(epochs=1), 'RM-Softmax': dict(epochs=1),
         'GraphRouter': dict(epochs=1), 'AvengersPro': dict(n_init=1), 'kNN': {}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--train', type=int, default=30000); ap.add_argument('--models', type=int, default=11)
    ap.add_argument('--width', type=int, default=384)
    a = ap.parse_args()
    obs, _, _ = simulate(widen('gpqa_like', a.models), n_train=a.train, n_test=10, seed=0)
    sup = supervision(obs, 'dars')
    X = np.random.default_rng(0).standard_normal((len(sup.query_ids), a.width))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    featurizer = SentenceFeaturizer().fit()
    print(f"{a.train:,} training queries x {len(sup.models)} models, features of width {a.width}")
    print(f"{'family':<12} {'file MB':>8} {'members MB':>11} {'manifest MB':>12} {'members':>8} {'fit s':>7}")
    largest = 0
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter('ignore', ConvergenceWarning)
        for family, params in QUICK.items():
            t = time.perf_counter()
            router = ROUTERS[family](**params)
            cv = cross_validate(router, X, sup, sup, folds=2)
            router.fit(X, sup)
            seconds = time.perf_counter() - t
            bundle = RouterBundle(models=list(sup.models), lam=0.05, beta=0.2, mode='dars', featurizer=featurizer,
                                  router=router, guard=cv.margin(0.05), guard_cv=cv)
            p = save_bundle(bundle, Path(tmp) / f'{family}.zip')
            with zipfile.ZipFile(p) as z:
                infos = z.infolist()
                members = sum(i.file_size for i in infos)
                manifest = z.getinfo('manifest.json').file_size
            largest = max(largest, members)
            print(f"{family:<12} {p.stat().st_size / 1e6:>8.1f} {members / 1e6:>11.1f} {manifest / 1e6:>12.2f} "
                  f"{len(infos):>8} {seconds:>7.0f}")
    print(f"largest: {largest / 2**20:.0f} MiB decompressed; the reader's default cap {DEFAULT_MAX_MB:,} MiB "
          f"is {DEFAULT_MAX_MB / (largest / 2**20):.1f}x that")


if __name__ == '__main__':
    main()
