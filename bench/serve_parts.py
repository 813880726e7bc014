"""`dars serve` with its parts timed inside the server: the thread's CPU time of every call to parsing, ranking and
accounting, summed, written as JSON to OUT at each SIGUSR1 and at exit (`bench_serve.py` reads the difference).

Run: python bench/serve_parts.py OUT serve --router ... --pool ... --port ...
     python bench/serve_parts.py --no-ranking - serve --router ... --pool ... --port ...

With --no-ranking the endpoint does everything but rank: every request gets the bundle's model order as it stands.
Beside the real endpoint under the same load, the difference of their CPU per request is what the ranking costs in
the server, without any clock read added to it.

The figures of a part timed in a loop understate what it costs in the server, where the socket work between two
requests pushes its code and data out of the processor's caches; these are the ones the split of the endpoint's
CPU uses. Each timed call costs two more reads of the thread's clock: their cost, measured at start, is taken off
every call (reading the clock costs more in the server than at start, so the parts still read a little high).
"""
import atexit, json, signal, sys, time

from dars_nb.bundle.fast import FastRanker
from dars_nb.serve import app
from dars_nb.serve.metrics import DailyLedger, Histogram

TOTALS = {'parsing (parse_chat_request)': 0, 'ranking (FastRanker, one text)': 0,
          'accounting (ledger, counts, histograms)': 0, 'requests': 0}


def clock_cost_ns(n: int = 5000) -> float:
    "What the two reads of the thread's clock around one call cost (warm): taken off every timed call."
    t0 = time.thread_time_ns()
    for _ in range(n): time.thread_time_ns(); time.thread_time_ns()
    return (time.thread_time_ns() - t0) / n


def timed(fn, part, counts=False):
    "`fn`, its thread CPU time added to `TOTALS[part]` at every call (and the call counted as a request)."
    def wrapper(*args, **kwargs):
        t0 = time.thread_time_ns()
        try: return fn(*args, **kwargs)
        finally:
            TOTALS[part] += time.thread_time_ns() - t0 - CLOCK_NS
            if counts: TOTALS['requests'] += 1
    return wrapper


def bundle_order(self, texts, lam=None):
    "The bundle's models in their own order for every text: the endpoint without its ranking."
    return [list(self.names) for _ in texts]


def write(*_):
    "The totals so far (seconds, and requests) to the file named on the command line."
    with open(OUT, 'w') as f: json.dump({k: v / 1e9 if k != 'requests' else v for k, v in TOTALS.items()}, f)


if __name__ == '__main__':
    if sys.argv[1] == '--no-ranking':   # no timers either: the process is the endpoint, minus its ranking
        FastRanker.__call__ = bundle_order
        del sys.argv[1]
    else:
        OUT, CLOCK_NS = sys.argv[1], clock_cost_ns()
        app.parse_chat_request = timed(app.parse_chat_request, 'parsing (parse_chat_request)', counts=True)
        FastRanker.__call__ = timed(FastRanker.__call__, 'ranking (FastRanker, one text)')
        for cls, name in ((app.Attempts, 'charge'), (DailyLedger, 'reserve'), (Histogram, 'observe')):
            setattr(cls, name, timed(getattr(cls, name), 'accounting (ledger, counts, histograms)'))
        signal.signal(signal.SIGUSR1, write)
        atexit.register(write)
    from dars_nb.cli import main
    sys.argv = ['dars'] + sys.argv[2:]
    sys.exit(main())
