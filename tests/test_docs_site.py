"""The docs site in a real browser: every page opens in headless Chromium with no console error, every
internal link resolves, no request leaves this machine, every chart is a drawn SVG that fits the text
column at 1280 px and whose text stays at least 9 px at 400 px, every code block wraps to its column at
1280 px, at 400 px no page scrolls sideways (charts, tables and formulas scroll in their own box) and printed
text keeps its lines, no heading id appears twice on a page, API headings show dunder names as written, pages
link to each other and not to the published copy, and the README's links into the docs site name pages,
anchors and images the site has.

Each page is opened once (the `visits` fixture): measured at 1280 px, then with the window narrowed to 400 px;
a few pages opened in a 400 px window check that narrowing a page measures as opening it narrow.

The site is built once for this module with `tools.docs_site.build_docs` (set `DARS_DOCS_SITE=/path/to/_site`
to check an already built site instead), served on 127.0.0.1, and visited through selenium with the
system's chromium and chromedriver (Debian packages `chromium`, `chromium-driver`; `make setup`
installs them). Screenshots of the home page and a tutorial go to `test-artifacts/`.
"""
import functools
import json
import os
import re
import shutil
import threading
import time
from html import unescape
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.error import HTTPError
from urllib.parse import urldefrag, urlsplit
from urllib.request import urlopen

import pytest

pytestmark = pytest.mark.xdist_group('docs_site')   # one worker builds the site once, for this module
# (module fixtures: the browser, about 1 GB, is closed when the module ends, not kept to the end of the run)

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / 'test-artifacts'
LOCAL_HOSTS = {'127.0.0.1', 'localhost'}
CHROMIUM = shutil.which('chromium') or '/usr/bin/chromium'
CHROMEDRIVER = shutil.which('chromedriver') or '/usr/bin/chromedriver'
# Chromium flags for a closed network: no background traffic, no first-run work, a fresh profile.
CHROMIUM_FLAGS = ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                  '--disable-background-networking', '--disable-component-update', '--disable-sync',
                  '--disable-dev-shm-usage', '--window-size=1280,1000']


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args): pass


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "The built site: `DARS_DOCS_SITE` if set, else built once for this module."
    if os.environ.get('DARS_DOCS_SITE'): return Path(os.environ['DARS_DOCS_SITE'])
    from tools.docs_site import build_docs
    t = time.time()
    # the pages as they render, from the notebooks' stored outputs (the home page and tutorials keep theirs):
    # running every cell again is tests/test_notebooks.py's job, and `make docs` does it for the published site
    out = build_docs(tmp_path_factory.mktemp('docs') / '_site', execute=False, root=ROOT, quiet=True)
    print(f'docs site built in {time.time() - t:.0f}s')
    return out


@pytest.fixture(scope='module')
def base_url(site):
    "The site served by a local HTTP server on 127.0.0.1 (any free port)."
    httpd = ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f'http://127.0.0.1:{httpd.server_address[1]}/'
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope='module')
def browser(tmp_path_factory):
    "Headless Chromium through chromedriver, logging console messages and every network request."
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail('chromium and chromedriver are needed (Debian packages chromium, chromium-driver; make setup installs them)')
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    opts.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + [f'--user-data-dir={tmp_path_factory.mktemp("chromium-profile")}']:
        opts.add_argument(flag)
    opts.set_capability('goog:loggingPrefs', {'browser': 'ALL', 'performance': 'ALL'})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _pages(site):
    "Every HTML page of the site except the 404 page, relative to the site root."
    return sorted(p.relative_to(site).as_posix() for p in site.rglob('*.html') if p.name != '404.html')


SETTLE_S = 0.3   # after a page is complete, for its scripts and the search worker to start (and log what they do)

def _load(browser, url) -> float:
    "Load `url` and wait until it is complete (the network log emptied first); the monotonic time it was."
    browser.get_log('performance')                                  # drop what came before
    browser.get(url)
    for _ in range(100):
        if browser.execute_script('return document.readyState') == 'complete': break
        time.sleep(0.05)
    return time.monotonic()


def _requests(browser) -> list:
    "The URLs of the network requests made since the network log was last read."
    urls = []
    for entry in browser.get_log('performance'):
        msg = json.loads(entry['message'])['message']
        if msg.get('method') == 'Network.requestWillBeSent': urls.append(msg['params']['request']['url'])
    return urls


def _open(browser, url) -> list:
    "Load `url`, let it settle, and return the network requests it made."
    _load(browser, url)
    time.sleep(SETTLE_S)
    return _requests(browser)


_status_cache = {}

def _fetch(url):
    "(HTTP status, body) of a local URL, cached."
    if url not in _status_cache:
        try:
            with urlopen(url, timeout=10) as r: _status_cache[url] = (r.status, r.read().decode('utf-8', 'replace'))
        except HTTPError as e: _status_cache[url] = (e.code, '')
    return _status_cache[url]


def _has_anchor(page_html, frag):
    ids = {unescape(i) for i in re.findall(r'\sid="([^"]*)"', page_html)}
    return unescape(frag) in ids


def test_one_page_per_notebook(site):
    from nbdev.config import get_config
    from tools.docs_notebooks import doc_notebooks, page_path
    nbs = get_config(ROOT).nbs_path
    expected = sorted([page_path(p.relative_to(nbs)).with_suffix('.html').as_posix() for p in doc_notebooks(nbs)]
                      + ['reference/benchmarks.html'])   # and bench/RESULTS.md, which pages link to
    assert _pages(site) == expected
    # the README's chart images are published where its links point once a docs site is declared
    readme_images = sorted(f.name for f in (ROOT / 'docs_assets').iterdir())
    assert readme_images and sorted(f.name for f in (site / 'docs_assets').iterdir()) == readme_images


# What a page shows at 1280 px: its links, its charts (marks, size, column, scroll width, drawn width) and the code blocks
# (not printed text) wider than their column
WIDE = """
    const charts = Array.from(document.querySelectorAll('.chart-output'), d => {
        const s = d.querySelector('svg'); if (!s) return null;
        const r = s.getBoundingClientRect();
        return [s.querySelectorAll('path, rect, line, text, circle').length, r.width, r.height, d.clientWidth,
                d.scrollWidth, parseFloat(s.getAttribute('width')) || null];
    });
    const code = Array.from(document.querySelectorAll('.md-content pre > code'), (c, i) => [i, c.scrollWidth, c.clientWidth, c])
                      .filter(([i, s, w, c]) => !c.closest('.language-text') && s > w + 1).map(x => x.slice(0, 3));
    return [Array.from(document.querySelectorAll('a[href]'), a => a.href), charts, code,
            document.querySelectorAll('.md-content pre > code').length];"""

# What it shows at 400 px: the page's width and the window's, each printed text block (lines, lines shown, white-space,
# outside the window), how many charts, tables or formulas reach outside the window, each chart's smallest text in px
NARROW = """
    const de = document.documentElement, room = de.clientWidth;
    const out = (e) => e.getBoundingClientRect().right > room + 0.5 || e.getBoundingClientRect().left < -0.5;
    const text = Array.from(document.querySelectorAll('.md-content .language-text pre > code'), c => {
        const cs = getComputedStyle(c), pad = parseFloat(cs.paddingTop) + parseFloat(cs.paddingBottom);
        const lines = c.textContent.replace(/\\n$/, '').split('\\n').length;
        return [lines, (c.clientHeight - pad) / parseFloat(cs.lineHeight), cs.whiteSpace, out(c)];
    });
    const boxes = Array.from(document.querySelectorAll('.md-content .chart-output, .md-content table, .md-content math'),
                             e => out(e.closest('.chart-output, .html-output, .md-typeset__scrollwrap') || e));
    const chart_text = Array.from(document.querySelectorAll('.chart-output svg'), s => {
        const scale = s.getBoundingClientRect().width / s.viewBox.baseVal.width;
        const px = Array.from(s.querySelectorAll('text'), t => parseFloat(getComputedStyle(t).fontSize) * scale);
        return px.length ? Math.min(...px) : null;
    });
    return [de.scrollWidth, room, text, boxes.filter(Boolean).length, chart_text];"""


def _window(browser, width):
    "Resize the window to `width` px and wait two frames, so that the page has laid itself out and handled the resize."
    browser.set_window_size(width, 1000)
    shown = browser.execute_async_script(
        'const done = arguments[arguments.length - 1];'
        'requestAnimationFrame(() => requestAnimationFrame(() => done(window.innerWidth)));')
    assert shown == width, f'the window is {shown} px wide, not {width}'


@pytest.fixture(scope='module')
def visits(site, base_url, browser) -> dict:
    """Every page opened once: {page: {requests, errors, hrefs, charts, code, n_code, narrow}}, what it asked the network
    for and logged as errors, what `WIDE` measures at 1280 px, and what `NARROW` measures once the window is 400 px."""
    seen = {}
    try:
        for page in _pages(site):
            loaded = _load(browser, base_url + page)
            hrefs, charts, code, n_code = browser.execute_script(WIDE)
            _window(browser, 400)
            narrow = browser.execute_script(NARROW)
            _window(browser, 1280)
            time.sleep(max(0.0, SETTLE_S - (time.monotonic() - loaded)))   # the page has settled (the two layouts took a while)
            requests = _requests(browser)
            errors = [e['message'] for e in browser.get_log('browser') if e['level'] == 'SEVERE']
            seen[page] = dict(requests=requests, errors=errors, hrefs=hrefs, charts=charts, code=code, n_code=n_code,
                              narrow=narrow)
    except BaseException:   # a page that failed mid-visit leaves the window wide for the tests that follow
        browser.set_window_size(1280, 1000)
        raise
    return seen


def test_every_page_in_the_browser(site, visits):
    problems = []
    for page, v in visits.items():
        for u in v['requests']:
            parts = urlsplit(u)
            if parts.scheme in ('http', 'https', 'ws', 'wss') and parts.hostname not in LOCAL_HOSTS:
                problems.append(f'{page}: request to another host: {u}')
        problems += [f'{page}: console error: {e}' for e in v['errors']]
        for href in set(v['hrefs']):
            parts = urlsplit(href)
            if parts.scheme not in ('http', 'https') or parts.hostname not in LOCAL_HOSTS: continue
            target, frag = urldefrag(href)
            status, body = _fetch(target)
            if status != 200: problems.append(f'{page}: broken link {href} (HTTP {status})')
            elif frag and target.endswith('.html') and not _has_anchor(body, frag):
                problems.append(f'{page}: link to a missing anchor {href}')
        for i, c in enumerate(v['charts']):
            if c is None or c[0] < 3 or c[1] < 10 or c[2] < 10:
                problems.append(f'{page}: chart {i} did not render (svg marks, width, height = {c and c[:3]})')
        n_outputs = len(re.findall(r'<div class="chart-output">', (site / page).read_text(encoding='utf-8')))
        if n_outputs != len(v['charts']): problems.append(f"{page}: {n_outputs} chart outputs but {len(v['charts'])} in the page")
    assert len(visits) == len(_pages(site))
    assert not problems, '\n'.join(problems[:40])


def test_charts_fit_the_text_column(visits):
    "At a 1280 px window every chart fits its container: nothing scrolls sideways or is cut off."
    offenders = [f'{page}: chart {i} is {shown:.0f} px wide (drawn {drawn} px) in a {room} px column'
                 for page, v in visits.items() for i, c in enumerate(v['charts']) if c is not None
                 for _, shown, _, room, scroll, drawn in [c] if shown > room + 0.5 or scroll > room + 0.5]
    assert sum(map(len, (v['charts'] for v in visits.values()))) > 20, 'fewer than 20 charts on the site'
    assert not offenders, f'{len(offenders)} chart(s) overflow the text column:\n' + '\n'.join(offenders)


def test_code_blocks_fit_the_text_column(visits):
    "At a 1280 px window no code block scrolls sideways: long lines wrap (printed text keeps its lines: see below)."
    offenders = [f'{page}: code block {i} is {s} px wide in {w} px' for page, v in visits.items() for i, s, w in v['code']]
    assert sum(v['n_code'] for v in visits.values()) > 500, 'fewer than 500 code blocks on the site'
    assert not offenders, f'{len(offenders)} code block(s) scroll sideways:\n' + '\n'.join(offenders[:40])


def test_narrow_screen_scrolls_boxes_not_pages(visits):
    """At a 400 px window no page scrolls sideways: a chart, a table or a formula wider than the column scrolls in its
    own box; printed text (a text table) keeps each line on one line, aligned, and scrolls in its box."""
    problems, n_text = [], 0
    for page, v in visits.items():
        page_width, room, text, boxes_out, _ = v['narrow']
        if page_width > room: problems.append(f'{page}: the page is {page_width} px wide in a {room} px window')
        if boxes_out: problems.append(f'{page}: {boxes_out} chart(s), table(s) or formula(s) reach outside the window')
        for i, (lines, shown, white_space, out) in enumerate(text):
            if white_space != 'pre' or abs(shown - lines) > 0.5 or out:
                problems.append(f'{page}: text block {i} has {lines} lines shown on {shown:.1f} ({white_space}, outside: {out})')
        n_text += len(text)
    assert n_text > 50, f'only {n_text} printed text blocks on the site: are outputs still rendered as text blocks?'
    assert not problems, f'{len(problems)} problem(s) at 400 px:\n' + '\n'.join(problems[:40])


def test_chart_text_legible_on_a_narrow_screen(visits):
    "At a 400 px window every chart's smallest text is drawn at 9 px or more (the chart scrolls instead of shrinking)."
    small = [f'{page}: chart {i} has text at {px:.1f} px' for page, v in visits.items()
             for i, px in enumerate(v['narrow'][4]) if px is not None and px < 8.99]
    assert not small, f'{len(small)} chart(s) shrink their text below 9 px at 400 px:\n' + '\n'.join(small[:40])


def _narrow_view(measured) -> tuple:
    "What `NARROW` measured, its fractions rounded to 0.01 px or line (layouts of one width agree far closer than that)."
    page_width, room, text, boxes_out, chart_text = measured
    r = lambda x: None if x is None else round(x, 2)
    return page_width, room, [(lines, r(shown), ws, out) for lines, shown, ws, out in text], boxes_out, [r(px) for px in chart_text]


def test_a_page_opened_narrow_is_the_page_narrowed(base_url, browser, visits):
    """The 400 px checks above measure pages narrowed after loading; the first pages with charts and the page with the
    most printed text, opened in a 400 px window, measure the same."""
    charts = [p for p, v in visits.items() if v['charts']][:2]
    text = max(visits, key=lambda p: len(visits[p]['narrow'][2]))
    _window(browser, 400)
    try:
        for page in charts + [text]:
            _open(browser, base_url + page)
            assert _narrow_view(browser.execute_script(NARROW)) == _narrow_view(visits[page]['narrow']), page
    finally:
        _window(browser, 1280)


def test_headings_unique_and_dunders_as_code(site):
    "No page has two headings with one id (a method documented twice would); `__call__` is shown, not read as bold."
    problems = []
    for page in _pages(site):
        html = (site / page).read_text(encoding='utf-8')
        ids = re.findall(r'<h[1-6][^>]*\sid="([^"]+)"', html)
        problems += [f'{page}: id {i!r} appears {ids.count(i)} times' for i in sorted(set(ids)) if ids.count(i) > 1]
        for hid, inner in re.findall(r'<h[2-4][^>]*\sid="([^"]*__[^"]*)"[^>]*>(.*?)</h[2-4]>', html, re.S):
            if '<strong>' in inner or '__' not in unescape(re.sub('<[^>]+>', '', inner)):
                problems.append(f'{page}: heading {hid!r} shows {inner[:80]!r}')
    assert not problems, f'{len(problems)} problem(s):\n' + '\n'.join(problems[:40])


def _declared_urls() -> dict:
    "The project's addresses ([project.urls] of pyproject.toml), by label."
    import tomllib
    return tomllib.loads((ROOT / 'pyproject.toml').read_text())['project'].get('urls', {})


def test_pages_link_to_each_other_not_to_the_published_copy(site):
    "A page reaches the others by relative links, so a built copy reads offline: none links to the project's own addresses."
    hosts = '|'.join(re.escape(u.split('//', 1)[1].rstrip('/')) for u in _declared_urls().values())
    assert hosts, 'pyproject.toml declares no [project.urls]'
    own = re.compile(rf'<a\s[^>]*href=["\']?(?:https?:)?//(?:www\.)?(?:{hosts})(?:[/?#"\'\s>]|$)', re.I)
    found = []
    for page in _pages(site):
        html = (site / page).read_text(encoding='utf-8')
        found += [f'{page}: {m.group(0)}' for m in own.finditer(html)]
    assert not found, f'{len(found)} link(s) to the published copy:\n' + '\n'.join(found[:40])


def test_readme_links_resolve_on_the_site(site):
    "Each README link and image into the declared docs site names a file the site publishes, and an anchor it has."
    from tools.docs_readme import docs_url
    docs = docs_url(ROOT)
    assert docs.startswith('https://'), 'pyproject.toml declares no docs site'
    readme = re.sub(r'```.*?```', '', (ROOT / 'README.md').read_text(encoding='utf-8'), flags=re.S)
    targets = re.findall(r'\]\((' + re.escape(docs) + r'/[^)\s]*)\)', readme)
    assert len(targets) >= 5 and any(t.endswith('.svg') for t in targets), targets   # its pages and its chart
    broken = []
    for t in sorted(set(targets)):
        path, frag = urldefrag(t[len(docs) + 1:])
        if not (site / path).is_file(): broken.append(f'{t}: no {path} in the site')
        elif frag and not _has_anchor((site / path).read_text(encoding='utf-8'), frag): broken.append(f'{t}: no anchor {frag}')
    assert not broken, '\n'.join(broken)


def test_search_works_offline(base_url, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    _open(browser, base_url + 'index.html')
    browser.find_element(By.CSS_SELECTOR, 'label.md-search__icon, .md-search__input').click()
    box = browser.find_element(By.CSS_SELECTOR, 'input.md-search__input')
    box.send_keys('instability')
    WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.CSS_SELECTOR, '.md-search-result__item'))
    assert browser.find_elements(By.CSS_SELECTOR, '.md-search-result__item')


def _screenshot(browser, url, path, max_height=10000):
    _open(browser, url)
    h = browser.execute_script('return document.documentElement.scrollHeight')
    browser.set_window_size(1280, min(max(h, 800), max_height))
    time.sleep(0.3)
    browser.save_screenshot(str(path))
    browser.set_window_size(1280, 1000)


def test_screenshots(site, base_url, browser):
    ARTIFACTS.mkdir(exist_ok=True)
    tutorials = [p for p in _pages(site) if p.startswith('tutorials/')]
    assert tutorials, 'the site has no tutorial'
    _screenshot(browser, base_url + 'index.html', ARTIFACTS / 'docs-home.png')
    _screenshot(browser, base_url + tutorials[0], ARTIFACTS / 'docs-tutorial.png')
    assert (ARTIFACTS / 'docs-home.png').stat().st_size > 10_000
    assert (ARTIFACTS / 'docs-tutorial.png').stat().st_size > 10_000
