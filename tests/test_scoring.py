"Scorer robustness beyond the notebook: random malformed responses and many worker threads."
import concurrent.futures as cf
import random

from dars_nb.scoring import score_response

PIECES = ['Final Answer:', '**Final Answer**', 'final answer is', 'Answer:', '\\boxed{', '}', '{', '$', '$$',
          '\\frac{1}{2}', '(B)', 'B.', 'a', 'the', '1,000', '-', '|', ';', '\n', '\n\n', ' ', '**', '`', '\\[', '\\]',
          'x^2', '=', '0.5', 'Norwegian and Polish', '\u00e9', '\\text{', '((', '))']
CASES = (('choice', 'B'), ('math', '\\frac{1}{2}'), ('reading', ['1000', 'Norwegian and Polish']))


def _garbage(rng, n):
    return ''.join(rng.choice(PIECES) for _ in range(rng.randint(0, n)))


def test_random_responses_never_raise():
    rng = random.Random(0)
    for _ in range(300):
        text = _garbage(rng, 12)
        for kind, gold in CASES:
            score, parsed = score_response(kind, text, gold)
            assert isinstance(score, float) and 0.0 <= score <= 1.0, (kind, text, score)
            assert isinstance(parsed, bool)
            if not parsed: assert score == 0.0


def test_scoring_from_worker_threads_matches_main_thread():
    rng = random.Random(1)
    texts = [_garbage(rng, 8) for _ in range(60)] + ['Final Answer: 0.5', 'Final Answer: (B)', 'Final Answer: 1,000']
    jobs = [(kind, t, gold) for t in texts for kind, gold in CASES]
    main = [score_response(*j) for j in jobs]
    with cf.ThreadPoolExecutor(4) as ex:
        threaded = list(ex.map(lambda j: score_response(*j), jobs))
    assert threaded == main
