#!/usr/bin/env python3
"""Open an HTML file in headless Chromium and fail on anything a reader would hit.

Usage: scripts/browser_check.py HTML_FILE PNG_OUT   (run with the venv of scripts/pyenv)

Drives Debian's `chromium` over the DevTools protocol (websocket-client), loads the file
in a 1280-px wide viewport, and collects as problems: console errors, warnings and failed
asserts; uncaught exceptions; Log entries of level error; failed loads; any request other
than the page itself and data: URLs (a report must be one self-contained file that works
offline); a page wider than the viewport (a horizontal scrollbar); any table but a PE grid
whose right edge passes the viewport or that scrolls inside its box (the key columns of a
report must be on screen); and a first block after the page's <h1> other than the
executive summary, <section id="summary"> (a report leads with the answer). Then takes a
full-page screenshot, 1280 px wide, to PNG_OUT and prints one summary line. Exit status:
0 if no problem, 1 if any (each listed on stderr), 2 on a usage error or if the browser
could not be driven. Env: CHROMIUM (binary), BROWSER_CHECK_TIMEOUT (s, default 60).
"""

import base64
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import websocket

WIDTH = 1280
# Chromium cannot capture much taller pages in one shot; BROWSER_CHECK_MAX_HEIGHT keeps only
# the top of the page (the README shows the top of the example report).
MAX_HEIGHT = min(16384, int(os.environ.get("BROWSER_CHECK_MAX_HEIGHT", "16384")))
TIMEOUT = float(os.environ.get("BROWSER_CHECK_TIMEOUT", "60"))


class Fail(Exception):
    """The browser could not be driven (not a problem of the page)."""


def find_chromium():
    # Debian's /usr/bin/chromium is a shell wrapper (it prints a spurious shm warning
    # on some hosts); the binary behind it takes the same flags.
    for cand in (os.environ.get("CHROMIUM"), "/usr/lib/chromium/chromium",
                 shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise Fail("chromium not found (apt-get install chromium, or set CHROMIUM)")


def start_chromium(profile, log):
    args = [
        find_chromium(), "--headless=new", "--no-sandbox",  # root cannot use the sandbox
        "--disable-gpu", "--disable-dev-shm-usage",  # containers: no GPU, small /dev/shm
        f"--user-data-dir={profile}", "--remote-debugging-port=0",
        "--no-first-run", "--no-default-browser-check", "--disable-extensions",
        "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--hide-scrollbars", "--mute-audio",
        # Resolve no host name: pages are recorded as requesting the network, not waited on.
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost",
        "about:blank",
    ]
    # Own process group, so that every renderer/GPU/zygote child is killed with it;
    # TMPDIR in the profile, so that what a killed chromium leaves there is removed with it.
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True, env=dict(os.environ, TMPDIR=profile))


def kill_group(proc):
    # TERM the group, give it 5 s, then KILL whatever of it is left.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def devtools_url(profile, proc, deadline):
    # Chromium writes "PORT\n/devtools/browser/ID" once it listens.
    path = pathlib.Path(profile) / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Fail(f"chromium exited with status {proc.returncode} at start")
        try:
            port, ws_path = path.read_text().split()[:2]
            return f"ws://127.0.0.1:{port}{ws_path}"
        except (OSError, ValueError):
            time.sleep(0.05)
    raise Fail("chromium did not open its DevTools port in time")


class Cdp:
    """One browser websocket, with a flattened session for the page target."""

    def __init__(self, url, deadline, on_event):
        self.deadline = deadline
        self.on_event = on_event
        self.ws = websocket.create_connection(url, timeout=5, suppress_origin=True)
        self.next_id = 0
        self.session = None
        self.waiting = "the browser"  # for the timeout message

    def recv(self):
        """Handle one incoming message; return it."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Fail(f"timed out after {TIMEOUT:g} s waiting for {self.waiting}")
        self.ws.settimeout(min(left, 5))
        try:
            msg = json.loads(self.ws.recv())
        except websocket.WebSocketTimeoutException:
            return {}
        if "method" in msg:
            self.on_event(msg["method"], msg.get("params", {}))
        return msg

    def send(self, method, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        self.waiting = f"the reply to {method}"
        while True:
            reply = self.recv()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise Fail(f"{method}: {reply['error'].get('message')}")
                return reply["result"]

    def wait_for(self, method):
        self.waiting = method
        while self.recv().get("method") != method:
            pass

    def drain(self, seconds):
        """Handle events for a while (late console messages, requests)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.ws.settimeout(max(end - time.monotonic(), 0.01))
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                return
            if "method" in msg:
                self.on_event(msg["method"], msg.get("params", {}))


# Layout facts the checks need, measured in the page: viewport and document widths, every
# table but the PE grids (its right edge, and how far its scrolling box hides it), and what
# follows the <h1>.
LAYOUT_JS = r"""(() => {
  const doc = document.documentElement;
  const out = {viewport: doc.clientWidth, page: doc.scrollWidth, tables: [], first: null};
  document.querySelectorAll('table:not(.grid)').forEach((t, i) => {
    const r = t.getBoundingClientRect();
    const box = t.closest('.scroll');
    const th = t.querySelector('th');
    out.tables.push({n: i + 1, right: Math.ceil(r.right), hidden: box ? box.scrollWidth - box.clientWidth : 0,
                     head: th ? th.textContent.trim() : ''});
  });
  const h1 = document.querySelector('h1');
  const e = h1 ? h1.nextElementSibling : null;
  out.first = e ? e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') : null;
  return JSON.stringify(out);
})()"""


def layout_problems(layout):
    """The layout checks on LAYOUT_JS's measurements."""
    problems = []
    vw = layout["viewport"]
    if layout["page"] > vw:
        problems.append(f"layout: the page is {layout['page']} px wide in a {vw}-px viewport "
                        "(a horizontal scrollbar)")
    for t in layout["tables"]:
        if t["right"] > vw or t["hidden"] > 0:
            problems.append(f"layout: table {t['n']} (first header {t['head']!r}) ends at {t['right']} px "
                            f"in a {vw}-px viewport, {t['hidden']} px of it scrolled out of view")
    if layout["first"] != "section#summary":
        problems.append(f"layout: the first block after <h1> is {layout['first']!r}, "
                        "not the executive summary (section#summary)")
    return problems


def check(html, png, profile):
    page_url = html.resolve().as_uri()
    problems, console, urls = [], [], {}

    def on_event(method, p):
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", a.get("type"))))
                            for a in p.get("args", []))
            console.append(text)
            if p["type"] in ("error", "warning", "assert"):
                problems.append(f"console.{p['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            desc = d.get("exception", {}).get("description") or d.get("text")
            problems.append(f"uncaught exception: {desc} (line {d.get('lineNumber', 0) + 1})")
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            e = p["entry"]
            problems.append(f"log error ({e.get('source')}): {e.get('text')} {e.get('url', '')}".rstrip())
        elif method == "Network.requestWillBeSent":
            url = urls[p["requestId"]] = p["request"]["url"]
            if url != page_url and not url.startswith("data:"):
                problems.append(f"request outside the file: {url}")
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            url = urls.get(p["requestId"], "?")
            problems.append(f"load failed: {p.get('errorText')}: {url}")

    deadline = time.monotonic() + TIMEOUT
    with open(os.path.join(profile, "chromium.log"), "wb") as log:
        proc = start_chromium(profile, log)
    try:
        cdp = Cdp(devtools_url(profile, proc, deadline), deadline, on_event)
        target = cdp.send("Target.createTarget", url="about:blank")["targetId"]
        cdp.session = cdp.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            cdp.send(f"{domain}.enable")
        cdp.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=800,
                 deviceScaleFactor=1, mobile=False)
        nav = cdp.send("Page.navigate", url=page_url)
        if nav.get("errorText"):
            raise Fail(f"cannot open {page_url}: {nav['errorText']}")
        cdp.wait_for("Page.loadEventFired")
        cdp.drain(0.5)
        title = cdp.send("Runtime.evaluate", expression="document.title")["result"].get("value", "")
        layout = json.loads(cdp.send("Runtime.evaluate", expression=LAYOUT_JS)["result"]["value"])
        problems.extend(layout_problems(layout))
        size = cdp.send("Page.getLayoutMetrics")
        size = size.get("cssContentSize") or size["contentSize"]
        height = min(max(math.ceil(size["height"]), 1), MAX_HEIGHT)
        shot = cdp.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                        clip={"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1})
        png.parent.mkdir(parents=True, exist_ok=True)
        png.write_bytes(base64.b64decode(shot["data"]))
        cdp.drain(0.1)  # anything the screenshot's relayout triggered
        cdp.ws.close()
    except (OSError, websocket.WebSocketException) as e:
        raise Fail(f"DevTools connection: {e}") from e
    finally:
        kill_group(proc)
    cut = f" (cut from {math.ceil(size['height'])})" if height < size["height"] else ""
    print(f"browser_check: {html}: title {title!r}, page {WIDTH}x{height} px{cut}, "
          f"{len(layout['tables'])} tables within {layout['viewport']} px checked, "
          f"{len(console)} console messages, {len(problems)} problems; screenshot {png}")
    return problems


def main():
    args = sys.argv[1:]
    if len(args) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    html, png = pathlib.Path(args[0]), pathlib.Path(args[1])
    if not html.is_file():
        print(f"browser_check: error: {html} is not a file", file=sys.stderr)
        return 2
    # SIGTERM/SIGHUP (e.g. from a CI timeout) unwind through the finally that kills chromium.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _f: sys.exit(128 + n))
    profile = tempfile.mkdtemp(prefix="browser_check.")
    try:
        problems = check(html, png, profile)
    except Fail as e:
        print(f"browser_check: error: {e}", file=sys.stderr)
        log = pathlib.Path(profile, "chromium.log")
        if log.exists():
            tail = log.read_text(errors="replace").splitlines()[-20:]
            print("chromium's last lines:", *tail, sep="\n  ", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    for p in problems:
        print(f"browser_check: problem: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
