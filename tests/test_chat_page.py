"The chat page of `dars serve --chat` in headless Chromium: a message sent through the page is answered by the model the router picks."
import json
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.test_docs_site import CHROMIUM, CHROMEDRIVER, CHROMIUM_FLAGS


@pytest.fixture(scope='module')
def endpoint():
    "`dars serve`'s app with the chat page, a two-model router and two fixed-answer models behind it."
    from dars_nb.bundle.training import train
    from dars_nb.pool.models import Pool, ModelSpec
    from dars_nb.pool.server import BackgroundServer
    from dars_nb.serve.app import create_app
    from dars_nb.serve.requests import ServeSettings
    from dars_nb.testing import FixedEndpoint
    words = ['apple', 'river', 'stone', 'cloud', 'maple', 'tiger', 'piano', 'lemon', 'orbit', 'quartz']
    rows = [dict(dataset='d', split='train', view='grid', query_id=str(i), model=m, rewrite_id=0, sample_id=0,
                 score=q, cost=c, query_text=f'question {w}')
            for i, w in enumerate(words) for m, q, c in (('big', 0.45 + 0.05 * i, 1.0), ('small', 0.4, 0.2))]
    bundle = train(dict(observations=pd.DataFrame(rows), router=dict(family='kNN', n_neighbors=1),
                        guard=dict(enabled=False)), quiet=True)
    small, big = FixedEndpoint('small says 4', delay_s=0).start(), FixedEndpoint('big says 4', delay_s=0).start()
    pool = Pool({'small': ModelSpec('small', small.base_url, price_in=1.0, price_out=2.0),
                 'big': ModelSpec('big', big.base_url, price_in=10.0, price_out=20.0)})
    app = create_app(bundle.rank, pool, ServeSettings(port=0), lam=bundle.lam, chat=True)
    with BackgroundServer(app) as server:
        yield bundle, server.base_url.removesuffix('/v1')
    small.stop(); big.stop()


@pytest.fixture(scope='module')
def browser(tmp_path_factory):
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail('chromium and chromedriver are needed (Debian packages chromium, chromium-driver; make setup installs them)')
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    opts.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + [f'--user-data-dir={tmp_path_factory.mktemp("chromium-chat")}']: opts.add_argument(flag)
    opts.set_capability('goog:loggingPrefs', {'browser': 'ALL', 'performance': 'ALL'})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _answers(browser, n, timeout=60):
    "The first `n` answers on the page (waits until they are there): (text, model, meta line)."
    from selenium.webdriver.common.by import By
    end = time.time() + timeout
    while time.time() < end:
        done = [a for a in browser.find_elements(By.CSS_SELECTOR, '.answer') if a.find_elements(By.CSS_SELECTOR, '.model')]
        errors = browser.find_elements(By.CSS_SELECTOR, '.error')
        if errors: pytest.fail(f'the page shows an error: {errors[0].text}')
        if len(done) >= n:
            return [(a.text, a.find_element(By.CSS_SELECTOR, '.model').text, a.find_element(By.CSS_SELECTOR, '.meta').text)
                    for a in done[:n]]
        time.sleep(0.1)
    pytest.fail(f'no {n} answers on the page after {timeout}s')


def test_chat_page_answers_through_the_router(endpoint, browser):
    from selenium.webdriver.common.by import By
    bundle, root = endpoint
    browser.get_log('performance')
    browser.get(root + '/chat')
    for _ in range(100):
        if 'routing between' in browser.find_element(By.ID, 'status').text: break
        time.sleep(0.1)
    assert browser.find_element(By.ID, 'lambda-value').get_attribute('value') == '0.05'   # the router's λ, from /health
    question = 'question quartz'          # big at λ 0.05 and at 0.35; small at 0.9
    browser.find_element(By.ID, 'message').send_keys(question)
    browser.find_element(By.ID, 'send').click()
    text, model, meta = _answers(browser, 1)[0]
    assert model == bundle.route([question])[0] == 'big'
    assert text.startswith('big says 4') and 'λ = 0.05' in meta
    spent = browser.find_element(By.ID, 'spend').text
    assert spent == '$0.0002', spent     # 10 prompt + 5 completion tokens at $10 and $20 per million
    # the λ slider: cost weighs so much at 0.9 that the same question goes to small
    browser.execute_script("const s = document.getElementById('lambda'); s.value = '0.9';"
                           "s.dispatchEvent(new Event('input', {bubbles: true}));")
    assert browser.find_element(By.ID, 'lambda-value').get_attribute('value') == '0.9'
    browser.find_element(By.ID, 'message').send_keys(question)
    browser.find_element(By.ID, 'send').click()
    text, model, meta = _answers(browser, 2)[1]
    assert model == bundle.route([question], 0.9)[0] == 'small'
    assert 'λ = 0.9' in meta
    assert browser.find_element(By.ID, 'spend').text == '$0.00022'
    # nothing was fetched from anywhere but the endpoint (no CDN, no font), and the console is clean
    urls = [json.loads(e['message'])['message']['params']['request']['url'] for e in browser.get_log('performance')
            if json.loads(e['message'])['message'].get('method') == 'Network.requestWillBeSent']
    web = [u for u in urls if not u.startswith(('chrome:', 'data:', 'blob:'))]   # Chromium's own pages aside
    assert web and all(u.startswith(root) for u in web), web
    assert not [e for e in browser.get_log('browser') if e['level'] == 'SEVERE']


def _posted(browser) -> list:
    "(request body, response MIME type) of each chat request the page sent since the log was last read."
    events = [json.loads(e['message'])['message'] for e in browser.get_log('performance')]
    sent = {e['params']['requestId']: json.loads(e['params']['request']['postData']) for e in events
            if e.get('method') == 'Network.requestWillBeSent' and e['params']['request']['url'].endswith('/v1/chat/completions')}
    mime = {e['params']['requestId']: e['params']['response']['mimeType'] for e in events
            if e.get('method') == 'Network.responseReceived' and e['params']['requestId'] in sent}
    return [(body, mime.get(rid)) for rid, body in sent.items()]


def test_chat_page_streams_and_clears(endpoint, browser):
    "Answers come as a stream; Clear empties the log and the conversation the next question is sent with."
    from selenium.webdriver.common.by import By
    bundle, root = endpoint
    browser.get(root + '/chat')
    for _ in range(100):
        if 'routing between' in browser.find_element(By.ID, 'status').text: break
        time.sleep(0.1)
    browser.get_log('performance')
    for n, question in enumerate(('question apple', 'question quartz'), 1):
        browser.find_element(By.ID, 'message').send_keys(question)
        browser.find_element(By.ID, 'send').click()
        answers = _answers(browser, n)                                    # each answered before the next is asked
    assert [model for _, model, _ in answers] == bundle.route(['question apple', 'question quartz'])
    assert [text.split('\n')[0] for text, _, _ in answers] == [f'{model} says 4' for _, model, _ in answers]
    posted = _posted(browser)
    assert [len(body['messages']) for body, _ in posted] == [1, 3]        # the second carries the conversation
    assert all(body['stream'] is True and mime == 'text/event-stream' for body, mime in posted), posted
    assert browser.find_element(By.ID, 'spend').text == '$0.0004'         # two answers of big, from the streams' usage
    browser.find_element(By.ID, 'clear').click()
    assert browser.find_elements(By.CSS_SELECTOR, '#log .turn') == []
    browser.find_element(By.ID, 'message').send_keys('question stone')
    browser.find_element(By.ID, 'send').click()
    assert len(_answers(browser, 1)) == 1
    assert [len(body['messages']) for body, _ in _posted(browser)] == [1]  # a new conversation
    assert browser.find_element(By.ID, 'spend').text == '$0.0006'         # the spend stays
    assert not [e for e in browser.get_log('browser') if e['level'] == 'SEVERE']
