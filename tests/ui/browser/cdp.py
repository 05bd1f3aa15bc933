"""A small Chrome DevTools Protocol client for the browser test: starts Debian's chromium headless
(never downloads a browser), talks to one page over a WebSocket (python3-websocket) and offers
what the test needs: evaluate JavaScript, wait for a condition, click, type, screenshot."""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import websocket  # python3-websocket (Debian)


class BrowserError(Exception):
    pass


class Chromium:
    """A headless chromium with a throw-away profile, and a session on its first page."""

    def __init__(self, executable, width=1280, height=900):
        if not shutil.which(executable):
            raise BrowserError(f"chromium not found ('{executable}'); install it: apt-get install chromium")
        self.profile = tempfile.mkdtemp(prefix="remat-chromium-")
        args = [
            executable, "--headless=new", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
            "--disable-extensions", "--disable-background-networking", "--disable-sync",
            "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
            f"--window-size={width},{height}", "--remote-debugging-port=0",
            f"--user-data-dir={self.profile}", "about:blank",
        ]
        # Chromium's sandbox refuses to run as root (containers, CI); the page is our own.
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.port = self._debugging_port()
        self.ws = websocket.create_connection(self._page_websocket_url(), timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events = []
        self.exceptions = []  # uncaught JavaScript exceptions on the page
        self.console_errors = []
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        # Content-Security-Policy violations (a script, style or picture the server's policy
        # blocks) are recorded by the page itself from its first line on.
        self.send("Page.addScriptToEvaluateOnNewDocument", source=(
            "window.__cspViolations = [];"
            "document.addEventListener('securitypolicyviolation',"
            " e => window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));"))

    def _debugging_port(self):
        # chromium writes the port it chose into DevToolsActivePort in the profile.
        path = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace")[-2000:]
                raise BrowserError(f"chromium exited with {self.process.returncode}: {err}")
            if os.path.exists(path):
                with open(path) as f:
                    first = f.readline().strip()
                if first.isdigit():
                    return int(first)
            time.sleep(0.1)
        raise BrowserError("chromium did not open its DevTools port within 30 s")

    def _page_websocket_url(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as r:
                targets = json.load(r)
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.1)
        raise BrowserError("chromium has no page target")

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    # -- protocol -------------------------------------------------------------------------------
    def _note_event(self, message):
        method = message.get("method")
        if method == "Runtime.exceptionThrown":
            d = message["params"]["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text")
            self.exceptions.append(text)
        elif method == "Runtime.consoleAPICalled" and message["params"].get("type") == "error":
            self.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in message["params"]["args"]))
        self.events.append(message)
        del self.events[:-200]

    def send(self, method, **params):
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == my_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._note_event(message)

    def evaluate(self, expression):
        """The value of a JavaScript expression (promises awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            d = result["exceptionDetails"]
            raise BrowserError(f"{expression!r}: {d.get('exception', {}).get('description') or d.get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression, what, timeout=20.0):
        """Polls until the expression is truthy; its value. Raises naming `what` otherwise."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            last = self.evaluate(expression)
            if last:
                return last
            time.sleep(0.1)
        raise BrowserError(f"timed out after {timeout:.0f} s waiting for {what} (last value: {last!r})")

    def navigate(self, url):
        self.send("Page.navigate", url=url)

    # -- input, as a user gives it --------------------------------------------------------------
    def _center(self, selector):
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        if not box:
            raise BrowserError(f"no element {selector}")
        return box

    def click(self, selector):
        x, y = self._center(selector)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type_into(self, selector, text):
        """Clicks a text box, selects what it holds and types `text` over it."""
        if self.evaluate(f"document.querySelector({json.dumps(selector)}).disabled"):
            raise BrowserError(f"{selector} is disabled: a user could not type into it")
        self.click(selector)
        self.evaluate(f"document.querySelector({json.dumps(selector)}).select()")
        if text:
            self.send("Input.insertText", text=text)
        else:
            self.send("Input.dispatchKeyEvent", type="keyDown", key="Delete", code="Delete", windowsVirtualKeyCode=46)
            self.send("Input.dispatchKeyEvent", type="keyUp", key="Delete", code="Delete", windowsVirtualKeyCode=46)

    def choose(self, selector, value):
        """Picks an option of a <select> (what a user's pick fires: a change event)."""
        self._center(selector)
        if self.evaluate(f"document.querySelector({json.dumps(selector)}).disabled"):
            raise BrowserError(f"{selector} is disabled: a user could not pick from it")
        ok = self.evaluate(
            f"(() => {{ const s = document.querySelector({json.dumps(selector)});"
            f" if (![...s.options].some(o => o.value === {json.dumps(value)})) return false;"
            f" s.focus(); s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change', {{bubbles: true}})); return true; }})()")
        if not ok:
            raise BrowserError(f"{selector} has no option {value!r}")

    def screenshot(self, path, selector=None):
        """A PNG of the viewport, with `selector` scrolled to the top of it when given."""
        if selector:
            self.evaluate(f"document.querySelector({json.dumps(selector)}).scrollIntoView({{block: 'start'}})")
            time.sleep(0.1)
        data = self.send("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
