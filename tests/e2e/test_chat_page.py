"""The chat page zinfer-http serves at / (docs/http.md, "Chat page"), driven
in a real headless browser.

Debian's Chromium (`apt-get install chromium`; scripts/setup installs it)
is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
JSON messages ended by a NUL byte on file descriptors 3 and 4), so no
Python package beyond the standard library is needed. The test is skipped
when no chromium binary is found (ZINFER_CHROMIUM names one).

One `zinfer serve --http` with an API key and a 64 KiB body limit: the page
loads without the key (it is public), shows the API's 401 until the key is
typed, lists the served model, and then, typed into as a user would
(Input.insertText, the Enter key, mouse clicks), a conversation of three
turns, each streamed answer (temperature 0) equal to the API's unstreamed
answer to the same request:
- a plain answer, the request the page sent checked field by field (the
  chosen model, the settings);
- reasoning (an output held by a regex to <think>...</think>, split by the
  server into reasoning_content deltas) in its collapsible block;
- a tool call (tool_choice required) shown as one;
then:
- the stop button ending a long answer early;
- an empty message and a paste over the body limit, each showing the API's
  error message;
- a screenshot (PNG of the window's size, not blank).
The page's headers (types, Content-Security-Policy), the key left off the
page but kept on the API, and --no-webui (404) are checked over raw HTTP.
"""

import base64
import fcntl
import http.client as httpc
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time

import pytest
from PIL import Image

from conftest import free_port, serve_process, stop_process, wait_http

KEY = "sk-page-test"
MAX_BODY = 64 * 1024
WIDTH, HEIGHT = 1100, 760


def find_chromium():
    env = os.environ.get("ZINFER_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def http_req(port, path, method="GET", key=None, body=None):
    """(status, headers, body bytes) of one request to zinfer-http."""
    c = httpc.HTTPConnection("127.0.0.1", port, timeout=30)
    h = {"Authorization": f"Bearer {key}"} if key else {}
    if body is not None:
        h["Content-Type"] = "application/json"
        body = json.dumps(body)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def above(fd, low=10):
    """fd moved to a number >= low (the old one closed)."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD, low)
    os.close(fd)
    return new


class Browser:
    """Headless Chromium on a DevTools pipe, with one page attached."""

    def __init__(self, binary, profile):
        # Chromium reads commands on fd 3 and writes replies on fd 4. Its
        # pipe ends are first moved above 4, so that putting one in place
        # cannot overwrite the other.
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        to_chrome_r, from_chrome_w = above(to_chrome_r), above(from_chrome_w)

        def pipes_in_place():  # in the child, before exec (fds 3 and 4 are kept)
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        args = ["--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
                "--disable-component-update", "--password-store=basic", "about:blank"]
        self.proc = subprocess.Popen([binary, *args], pass_fds=(3, 4),
                                     preexec_fn=pipes_in_place, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next = 0
        self._replies = {}
        self._cv = threading.Condition()
        self.events = queue.Queue()
        self.problems = []  # console errors and exceptions, CSP refusals among them
        self.posted = []  # the bodies of the page's POST requests, parsed
        threading.Thread(target=self._read, daemon=True).start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=WIDTH,
                  height=HEIGHT, deviceScaleFactor=1, mobile=False)

    def _read(self):
        buf = b""
        while True:
            try:
                data = os.read(self._from_chrome, 1 << 16)
            except OSError:
                data = b""
            if not data:
                with self._cv:
                    self._replies[None] = True  # the browser is gone
                    self._cv.notify_all()
                return
            buf += data
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cv:
                        self._replies[msg["id"]] = msg
                        self._cv.notify_all()
                else:
                    self._event(msg)

    def _event(self, msg):
        m, p = msg.get("method"), msg.get("params", {})
        if m == "Runtime.exceptionThrown":
            self.problems.append(p["exceptionDetails"].get("text", "exception"))
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error" \
                and p["entry"]["source"] != "network":  # the API's 4xx are the test's own
            self.problems.append(p["entry"]["text"])
        elif m == "Network.requestWillBeSent" and p["request"]["method"] == "POST" \
                and "postData" in p["request"]:
            try:
                self.posted.append(json.loads(p["request"]["postData"]))
            except ValueError:  # a large body may come cut short
                self.posted.append(None)
        self.events.put(msg)

    def call(self, method, session=False, timeout=30, **params):
        with self._cv:
            self._next += 1
            mid = self._next
        msg = {"id": mid, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        end = time.time() + timeout
        with self._cv:
            while mid not in self._replies:
                assert None not in self._replies, "the browser exited"
                left = end - time.time()
                assert left > 0, f"no reply to {method} in {timeout} s"
                self._cv.wait(left)
            reply = self._replies.pop(mid)
        assert "error" not in reply, (method, reply["error"])
        return reply["result"]

    def eval(self, expr):
        r = self.call("Runtime.evaluate", session=True, expression=expr, returnByValue=True,
                      awaitPromise=True)
        assert "exceptionDetails" not in r, (expr, r["exceptionDetails"])
        return r["result"].get("value")

    def wait(self, expr, timeout=20, what=None):
        end = time.time() + timeout
        while True:
            v = self.eval(expr)
            if v:
                return v
            assert time.time() < end, f"waited {timeout} s for {what or expr}"
            time.sleep(0.05)

    def navigate(self, url):
        while not self.events.empty():
            self.events.get_nowait()
        self.call("Page.navigate", session=True, url=url)
        end = time.time() + 20
        while True:
            ev = self.events.get(timeout=max(0.1, end - time.time()))
            if ev.get("method") == "Page.loadEventFired":
                return

    def fill(self, selector, text):
        """Replaces a field's text as typing or pasting would."""
        self.eval(f"(e => {{ e.focus(); e.select(); }})(document.querySelector({selector!r}))")
        if text:
            self.call("Input.insertText", session=True, text=text)
        else:
            self.key("Delete", 46)

    def key(self, name, code, text=None):
        down = {"type": "keyDown", "key": name, "code": name, "windowsVirtualKeyCode": code}
        if text:
            down["text"] = text
        self.call("Input.dispatchKeyEvent", session=True, **down)
        self.call("Input.dispatchKeyEvent", session=True, type="keyUp", key=name, code=name,
                  windowsVirtualKeyCode=code)

    def click(self, selector):
        x, y = self.eval(f"""(() => {{
            const r = document.querySelector({selector!r}).getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y,
                      button="left", clickCount=1)

    def screenshot(self):
        return base64.b64decode(self.call("Page.captureScreenshot", session=True,
                                          format="png")["data"])

    def close(self):
        try:
            os.close(self._to_chrome)  # the browser exits when its pipe closes
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        stop_process(self.proc)


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if not path:
        pytest.skip("no chromium binary found (apt-get install chromium, as scripts/setup "
                    "does, or set ZINFER_CHROMIUM): the chat page needs a browser to test")
    return path


@pytest.fixture(scope="module")
def server(zinfer_bin, model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("chat_page") / "serve.log"
    hport = free_port()
    with serve_process(zinfer_bin, model_path, log, "--threads-per-worker", 2,
                       "--http", f"127.0.0.1:{hport}", "--api-key", KEY,
                       "--http-max-body-bytes", MAX_BODY) as srv:
        wait_http(hport, srv)
        srv.port = hport
        yield srv


@pytest.fixture(scope="module")
def model(server):
    st, _, body = http_req(server.port, "/v1/models", key=KEY)
    assert st == 200, body
    return json.loads(body)["data"][0]["id"]


@pytest.fixture(scope="module")
def browser(chromium, tmp_path_factory):
    b = Browser(chromium, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def api_chat(port, body):
    st, _, data = http_req(port, "/v1/chat/completions", "POST", KEY, body)
    return st, json.loads(data)


def api_error(port, body):
    st, reply = api_chat(port, body)
    assert st >= 400, reply
    return f"Error {st}: {reply['error']['message']}"


def test_page_served(server):
    """The files, their types and policy; public while the API keeps its key."""
    port = server.port
    want = {"/": "text/html; charset=utf-8", "/page/chat.js": "text/javascript; charset=utf-8",
            "/page/chat.css": "text/css; charset=utf-8"}
    for path, ctype in want.items():
        st, h, body = http_req(port, path)  # no key
        assert st == 200 and h["content-type"] == ctype and body, (path, st, h)
        csp = h["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp, csp
        assert "http" not in csp and "*" not in csp, csp  # no outside source
        assert h["x-content-type-options"] == "nosniff"
    st, h, body = http_req(port, "/", method="HEAD")
    assert st == 200 and not body and int(h["content-length"]) > 0
    st, h, body = http_req(port, "/", method="POST", body={})
    assert st == 405 and h["allow"] == "GET, HEAD", body
    assert http_req(port, "/page/missing.js")[0] == 401  # not the page's: the API's rules
    assert http_req(port, "/page/missing.js", key=KEY)[0] == 404
    assert http_req(port, "/v1/models")[0] == 401


def test_no_webui(zinfer_bin, tmp_path):
    """--no-webui: / is a 404 like any unknown path. zinfer-http alone,
    copied away from the build and source trees: the page is in the binary."""
    exe = tmp_path / "zinfer-http"
    shutil.copy(zinfer_bin.parent / "zinfer-http", exe)
    for flags, want in (([], 200), (["--no-webui"], 404)):
        port = free_port()
        proc = subprocess.Popen([str(exe), "--listen", f"127.0.0.1:{port}", "--router",
                                 "tcp://127.0.0.1:1", *flags], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            end = time.time() + 10
            while True:
                try:
                    st, h, body = http_req(port, "/")
                    break
                except OSError:
                    assert time.time() < end and proc.poll() is None
                    time.sleep(0.1)
            assert st == want, (flags, st, body)
            if want == 404:
                assert json.loads(body)["error"]["message"] == "GET /: no such path"
                assert http_req(port, "/page/chat.js")[0] == 404
            else:
                assert b"/page/chat.js" in body
        finally:
            stop_process(proc)


def send(browser, text):
    """Types text into the message box and presses Enter; waits until the
    answer (or the error) is in, and returns the last assistant message."""
    n = int(browser.eval("document.body.dataset.answers"))
    browser.fill("#input", text)
    browser.key("Enter", 13, "\r")
    browser.wait(f"Number(document.body.dataset.answers) > {n} && "
                 "document.body.dataset.state === 'idle'", what="the answer")
    return browser.eval("""(() => {
        const m = document.querySelector('#messages .msg.assistant:last-child');
        const calls = m ? Array.from(m.querySelectorAll('.tool-call')).map(c => ({
            name: c.querySelector('.name').textContent,
            arguments: c.querySelector('.arguments').textContent})) : [];
        return m && {content: m.querySelector('.content').textContent,
                     reasoning: m.querySelector('.reasoning-text').textContent,
                     reasoningShown: !m.querySelector('.reasoning').hidden,
                     calls: calls, meta: m.querySelector('.meta').textContent};
    })()""")


def error_text(browser):
    return browser.eval("(e => e.hidden ? '' : e.textContent)(document.getElementById('error'))")


def new_chat(browser, extra="", max_tokens="40"):
    browser.click("#new-chat")
    browser.fill("#temperature", "0")
    browser.fill("#max-tokens", max_tokens)
    browser.fill("#extra", extra)


def test_chat_in_browser(server, model, browser, tmp_path):
    t0 = time.time()
    port = server.port
    browser.navigate(f"http://127.0.0.1:{port}/")
    # The page is public, the API is not: its 401 shows until the key is typed.
    want401 = f"Error 401: {json.loads(http_req(port, '/v1/models')[2])['error']['message']}"
    browser.wait("document.getElementById('error').textContent", what="the 401")
    assert error_text(browser) == want401
    browser.fill("#api-key", KEY)
    browser.key("Tab", 9)  # leaving the field loads the models with the key
    browser.wait("document.body.dataset.models === '1'", what="the model list")
    assert browser.eval("document.getElementById('model').value") == model
    assert error_text(browser) == ""

    # One conversation of three turns, each answer streamed into the page
    # and equal to the API's unstreamed answer to the same request.
    new_chat(browser)
    history = []

    def api_turn(question, max_tokens, fields):
        history.append({"role": "user", "content": question})
        st, whole = api_chat(port, {"model": model, "temperature": 0, "top_p": 1,
                                    "max_tokens": max_tokens, "messages": history, **fields})
        assert st == 200, whole
        return whole["choices"][0]

    # a plain answer, asked for as the settings say
    q = "Name three colors."
    got = send(browser, q)
    sent = browser.posted[-1]
    assert sent == {"model": model, "messages": [{"role": "user", "content": q}],
                    "stream": True, "stream_options": {"include_usage": True},
                    "temperature": 0, "top_p": 1, "max_tokens": 40}, sent
    ch = api_turn(q, 40, {})
    assert got["content"] == ch["message"]["content"] and got["content"].strip(), (got, ch)
    assert got["meta"].startswith(f"finish: {ch['finish_reason']}"), got["meta"]
    assert not got["reasoningShown"] and got["calls"] == []
    assert browser.eval("document.querySelector('#messages .msg.user .content').textContent") == q
    history.append({"role": "assistant", "content": got["content"]})

    # reasoning (the output held by a regex to <think>...</think>, which the
    # server streams as reasoning_content deltas), in its collapsible block
    # (at most 92 characters: it ends within max_tokens)
    fields = {"structured_outputs": {"regex": "<think>[a-z]{2,12}( [a-z]{2,12}){0,2}</think>"
                                              "[A-Z][a-z]{1,12}( [a-z]{1,12}){0,2}"}}
    browser.fill("#max-tokens", "100")
    browser.fill("#extra", json.dumps(fields))
    q = "Think, then name one more."
    got = send(browser, q)
    ch = api_turn(q, 100, fields)
    assert ch["message"].get("reasoning_content"), ch
    assert got["reasoningShown"] and got["reasoning"] == ch["message"]["reasoning_content"], \
        (got, ch)
    assert got["content"] == ch["message"]["content"], (got, ch)
    assert browser.eval("document.querySelector('#messages .msg.assistant:last-child "
                        ".reasoning').tagName") == "DETAILS"
    history.append({"role": "assistant", "content": got["content"]})

    # a tool call (tool_choice required), streamed as tool_calls deltas
    tools = {"tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string",
                                                      "enum": ["Paris", "London"]}},
            "required": ["city"]}}}], "tool_choice": "required"}
    browser.fill("#extra", json.dumps(tools))
    q = "What is the weather in Paris?"
    got = send(browser, q)
    ch = api_turn(q, 60, tools)
    calls = ch["message"]["tool_calls"]
    assert calls and got["calls"] == [{"name": c["function"]["name"],
                                       "arguments": c["function"]["arguments"]} for c in calls], \
        (got, calls)
    assert got["meta"].startswith("finish: tool_calls"), got["meta"]
    assert browser.eval("document.querySelectorAll('#messages .msg').length") == 6

    # The screenshot: the window's size, and more than one flat colour.
    png = browser.screenshot()
    shot = tmp_path / "chat_page.png"
    shot.write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (WIDTH,
                                                                                       HEIGHT)
    with Image.open(shot) as im:
        colors = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors and len(colors) > 50, f"a blank screenshot ({len(colors or [])} colours)"

    # The stop button ends a long answer.
    new_chat(browser, "", "1500")
    browser.fill("#temperature", "1")
    browser.fill("#input", "Write a long story about a dragon.")
    browser.click("#send")
    browser.wait("(m => m && m.textContent.length > 20)"
                 "(document.querySelector('#messages .msg.assistant .content'))",
                 what="the first words")
    browser.click("#stop")
    browser.wait("document.body.dataset.state === 'idle'", what="the stop")
    meta = browser.eval("document.querySelector('#messages .msg.assistant .meta').textContent")
    assert meta.startswith("stopped"), meta
    assert error_text(browser) == ""

    # An empty message on a new chat: nothing to send, and the API says so.
    new_chat(browser)
    assert send(browser, "") is None  # no answer shown
    want = api_error(port, {"model": model, "messages": [], "stream": True})
    assert error_text(browser) == want, want

    # A paste over the body limit: the API's 413, the text left in the box.
    big = "word " * (MAX_BODY // 5 + 100)
    assert send(browser, big) is None
    got = error_text(browser)
    assert re.fullmatch(rf"Error 413: the body \((\d+) bytes\) is larger than the limit of "
                        rf"{MAX_BODY} bytes", got), got
    assert int(re.search(r"\((\d+) bytes", got).group(1)) > MAX_BODY
    assert browser.eval("document.getElementById('input').value.length") == len(big)
    want = api_error(port, {"model": model, "messages": [{"role": "user", "content": big}]})
    assert want.split("(")[0] == got.split("(")[0] and want.split(")")[1] == got.split(")")[1]

    assert browser.problems == [], browser.problems  # no script error, no CSP refusal
    print(f"chat page test: {time.time() - t0:.1f} s in the browser")
