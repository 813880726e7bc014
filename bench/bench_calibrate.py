"""`dars calibrate` on 1,200 questions x 9 models: seconds per target, against routing every λ afresh.

Run: .venv/bin/python bench/bench_calibrate.py [--quick] [--reps 3]
Two guarded kNN bundles: one trained on 1,200 simulated questions with nine models (`widen('gpqa_like', 9)`),
calibrated on those questions; one trained on the shipped LLMRouter table (nine models), calibrated on 1,200
of its training questions (skipped with --quick). Each is calibrated to a share of its priciest and of its
cheapest model and to a mean cost; the time is the median of --reps runs per target, the worst target
reported. Side by side, once: the same calibration when every λ featurizes and predicts the questions again
(`RouterBundle.choose`, as the scan did before it computed the utilities once). Each printed λ is checked to
route the share it reports.
"""
import argparse, statistics, sys, time
from pathlib import Path

import numpy as np

from dars_nb.bundle.calibrate import Target, calibrate, RouteOutcomes
from dars_nb.bundle.training import train
from summary import emit

ROOT = Path(__file__).resolve().parents[1]
GOAL_SECONDS = 10.0
N_QUESTIONS = 1200


def simulated_bundle():
    "A guarded kNN bundle on 1,200 simulated questions and nine models, with its training questions."
    from dars_nb.simulate import simulate, widen
    from dars_nb.testing import simulated_texts
    obs, feats, _ = simulate(widen('gpqa_like', 9), n_train=N_QUESTIONS, n_test=0, seed=0)
    bundle = train(dict(observations=simulated_texts(obs, feats), router=dict(family='kNN', n_neighbors=10)), quiet=True)
    return bundle, bundle.meta['train_texts'][:N_QUESTIONS]


def llmrouter_bundle():
    "A guarded kNN bundle on the LLMRouter table (TF-IDF, 128 SVD dims), with 1,200 of its training questions."
    from dars_nb.sources.importers import read_llmrouter
    obs = read_llmrouter(ROOT / 'data' / 'routing' / 'llmrouter')
    bundle = train(dict(observations=obs, router=dict(family='kNN', n_neighbors=10),
                        features=dict(kind='tfidf', n_components=128)), quiet=True)
    return bundle, bundle.meta['train_texts'][:N_QUESTIONS]


def targets(bundle, texts) -> list:
    "Half the questions to the priciest model, a fifth to the cheapest, and the mean of the extreme costs."
    price = np.asarray(bundle.meta['mean_cost_usd'])
    out = RouteOutcomes(bundle, texts)
    costs = [out.at(lam).cost_usd for lam in (0.0, 64.0)]
    return [Target(share=0.5, model=bundle.models[int(price.argmax())]),
            Target(share=0.2, model=bundle.models[int(price.argmin())]), Target(cost_usd=float(np.mean(costs)))]


def routes_as_printed(bundle, texts, cal) -> bool:
    "Whether the printed λ sends every model the number of questions the calibration reports."
    chosen = bundle.route(texts, float(cal.text))
    return all(chosen.count(m) == round(s * len(texts)) for m, s in zip(bundle.models, cal.outcome.share))


def per_lambda_prediction(bundle, texts, target) -> float:
    "Seconds of one calibration whose every λ featurizes and predicts the questions again."
    cls = type(bundle.router)
    cls.lam_affine = False      # the scan then routes each λ with `RouterBundle.choose`
    try:
        t = time.perf_counter(); calibrate(bundle, texts, target); return time.perf_counter() - t
    finally: del cls.lam_affine


def measure(name, bundle, texts, reps) -> None:
    "Time each target, check its printed λ, and emit the worst target's median."
    rows = []
    for target in targets(bundle, texts):
        times = []
        for _ in range(reps):
            t = time.perf_counter(); cal = calibrate(bundle, texts, target); times.append(time.perf_counter() - t)
        ok = routes_as_printed(bundle, texts, cal)
        rows.append((target.describe(), statistics.median(times), cal.text, ok))
        print(f"  {target.describe():55s} {statistics.median(times):6.2f} s  λ = {cal.text:12s} routes as printed: {ok}")
    before = per_lambda_prediction(bundle, texts, targets(bundle, texts)[0])
    worst = max(r[1] for r in rows)
    print(f"  worst target {worst:.2f} s; every λ predicted afresh: {before:.1f} s ({before / worst:.0f}x)")
    emit(f"calibrate, {len(texts):,} questions x {len(bundle.models)} models ({name}, guarded kNN)",
         f"{worst:.2f} s for the slowest of 3 targets (every λ predicted afresh: {before:.1f} s); "
         f"printed λ routes as reported: {'yes' if all(r[3] for r in rows) else 'no'}",
         f"<= {GOAL_SECONDS:.0f} s", worst <= GOAL_SECONDS and all(r[3] for r in rows))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--quick', action='store_true', help='the simulated bundle only')
    ap.add_argument('--reps', type=int, default=3)
    a = ap.parse_args(argv)
    builds = [('simulated', simulated_bundle)] + ([] if a.quick else [('LLMRouter table', llmrouter_bundle)])
    for name, build in builds:
        t = time.perf_counter(); bundle, texts = build()
        print(f"{name}: {len(texts):,} questions x {len(bundle.models)} models, trained in {time.perf_counter() - t:.0f} s")
        measure(name, bundle, texts, a.reps)
    return 0


if __name__ == '__main__':
    sys.exit(main())
