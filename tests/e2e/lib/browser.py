#!/usr/bin/python3
"""A small headless-Chromium driver over the Chrome DevTools Protocol, stdlib only.

The browser is started with --remote-debugging-pipe: it reads commands on its fd 3 and
writes answers and events on its fd 4, each message a JSON object ended by a NUL byte.
Every read waits with select() and a deadline, so a hung browser fails a test instead of
hanging it; close() (also on exceptions, via the context manager) ends every process it
started and removes its profile directory.

    from browser import Browser, can_start
    ok, why = can_start()                 # (False, reason) when Chromium cannot run here
    with Browser() as b:
        b.open("http://127.0.0.1:8000/")
        b.wait_for("document.querySelectorAll('tr[data-unit]').length == 4", 10)
        b.type("#secret", "s3cret")
        b.click("button.kill[data-unit='1']")      # confirm() dialogs are accepted
        print(b.wait_for("document.getElementById('action-result').textContent", 5))
        b.screenshot("/tmp/page.png")

Command line: python3 browser.py URL OUT.png [WAIT_S]  -- loads URL, waits (2 s), saves
a full-page screenshot.
"""

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import base64

__all__ = ["Browser", "BrowserError", "can_start", "find_binary"]

CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser",
              "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """A protocol error, a JS exception or a browser that went away."""


def find_binary():
    """The browser binary: $DDILOCO_CHROMIUM, else the first of CANDIDATES on PATH."""
    env = os.environ.get("DDILOCO_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else shutil.which(env)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    for path in ("/usr/bin/chromium-headless-shell", "/usr/lib/chromium/headless_shell",
                 "/usr/bin/chromium"):
        if os.access(path, os.X_OK):
            return path
    return None


def _high_fd(fd):
    """A close-on-exec copy of fd numbered 10 or more (the original is closed)."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


class Browser:
    def __init__(self, binary=None, width=1400, height=1000, timeout_s=30.0,
                 extra_args=(), start=True):
        self.binary = binary or find_binary()
        self.width, self.height = width, height
        self.timeout_s = timeout_s          # default per-command deadline
        self.extra_args = list(extra_args)
        self.proc = None
        self.tmpdir = None
        self.log_path = None
        self._wfd = self._rfd = None
        self._buf = b""
        self._next_id = 0
        self._answers = {}
        self.events = []                    # protocol events not consumed yet
        self.dialogs = []                   # [(type, message)] of every JS dialog accepted
        self.console = []                   # [(level, text)] console messages of the page
        self.errors = []                    # uncaught JS exceptions of the page (texts)
        self.session = None                 # sessionId of the page opened by open()
        self.target = None
        if start:
            self.start()

    # -- life cycle -----------------------------------------------------------------

    def start(self):
        if self.proc is not None:
            return self
        if not self.binary:
            raise BrowserError("no Chromium found (tried %s)" % ", ".join(CANDIDATES))
        self.tmpdir = tempfile.mkdtemp(prefix="ddiloco-browser-")
        self.log_path = os.path.join(self.tmpdir, "chromium.log")
        try:
            cmd_r, cmd_w = os.pipe()        # we write commands, the browser reads (its fd 3)
            res_r, res_w = os.pipe()        # the browser writes answers (its fd 4), we read
            cmd_r, cmd_w, res_r, res_w = (_high_fd(f) for f in (cmd_r, cmd_w, res_r, res_w))
            self._wfd, self._rfd = cmd_w, res_r
            args = [self.binary, "--headless", "--disable-gpu", "--remote-debugging-pipe",
                    "--user-data-dir=" + os.path.join(self.tmpdir, "profile"),
                    "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                    "--disable-background-networking", "--disable-sync",
                    "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars",
                    "--window-size=%d,%d" % (self.width, self.height)]
            if os.geteuid() == 0:
                args.append("--no-sandbox")
            args += self.extra_args + ["about:blank"]
            # bash (dash takes one-digit fds only) moves the two pipe ends to fds 3 and 4
            # and execs the browser (same pid).
            script = 'exec "$@" 3<&%d 4>&%d %d<&- %d>&-' % (cmd_r, res_w, cmd_r, res_w)
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    ["/bin/bash", "-c", script, "bash"] + args, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=log, pass_fds=(cmd_r, res_w), start_new_session=True)
            os.close(cmd_r)
            os.close(res_w)
            os.set_blocking(self._rfd, False)
            self.send("Target.setDiscoverTargets", {"discover": False})   # first contact
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        """Close the browser; ends every process it started, removes its temp dir."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None and self._wfd is not None:
                try:
                    self._write({"id": self._new_id(), "method": "Browser.close"}, 2.0)
                except Exception:
                    pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            try:      # helpers (zygote, renderers) left in its process group
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for name in ("_wfd", "_rfd"):
            fd = getattr(self, name)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, None)
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def log_tail(self, n=2000):
        """The end of the browser's stderr (for error messages)."""
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    # -- protocol -------------------------------------------------------------------

    def _new_id(self):
        self._next_id += 1
        return self._next_id

    def _write(self, msg, timeout_s):
        data = json.dumps(msg).encode() + b"\0"
        deadline = time.monotonic() + timeout_s
        while data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("writing to the browser timed out")
            _, w, _ = select.select([], [self._wfd], [], left)
            if w:
                try:
                    data = data[os.write(self._wfd, data):]
                except BrokenPipeError:
                    raise BrowserError("the browser went away" + self._exit_note())

    def _exit_note(self):
        rc = self.proc.poll() if self.proc else None
        tail = self.log_tail(600).strip()
        return (" (exit %s)" % rc if rc is not None else "") + (": " + tail if tail else "")

    def _pump(self, timeout_s):
        """Reads what the browser wrote within timeout_s; handles dialogs; False on timeout."""
        if self.proc is None or self._rfd is None:
            raise BrowserError("the browser is not running")
        r, _, _ = select.select([self._rfd], [], [], max(0.0, timeout_s))
        if not r:
            return False
        try:
            chunk = os.read(self._rfd, 1 << 20)
        except BlockingIOError:
            return False
        if not chunk:
            raise BrowserError("the browser closed its pipe" + self._exit_note())
        self._buf += chunk
        while b"\0" in self._buf:
            raw, self._buf = self._buf.split(b"\0", 1)
            msg = json.loads(raw)
            if "id" in msg:
                self._answers[msg["id"]] = msg
            else:
                self._on_event(msg)
        return True

    def _on_event(self, msg):
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Page.javascriptDialogOpening":
            self.dialogs.append((params.get("type"), params.get("message")))
            cmd = {"id": self._new_id(), "method": "Page.handleJavaScriptDialog",
                   "params": {"accept": True, "promptText": params.get("defaultPrompt", "")}}
            if msg.get("sessionId"):
                cmd["sessionId"] = msg["sessionId"]
            self._write(cmd, 5.0)     # its answer is stored and never read: fine
            return
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", "")))
                            for a in params.get("args", []))
            self.console.append((params.get("type"), text))
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.errors.append(d.get("exception", {}).get("description") or d.get("text"))
        self.events.append(msg)
        del self.events[:-1000]

    def send(self, method, params=None, session=None, timeout_s=None):
        """Sends one command and returns its result; raises BrowserError on an error answer."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        msg_id = self._new_id()
        msg = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self._write(msg, timeout_s)
        deadline = time.monotonic() + timeout_s
        while msg_id not in self._answers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("%s: no answer in %.1f s" % (method, timeout_s))
            self._pump(left)
        answer = self._answers.pop(msg_id)
        if "error" in answer:
            raise BrowserError("%s: %s" % (method, answer["error"].get("message", answer["error"])))
        return answer.get("result", {})

    def page(self, method, params=None, timeout_s=None):
        """send() scoped to the page that open() attached to."""
        if not self.session:
            raise BrowserError("no page: call open() first")
        return self.send(method, params, self.session, timeout_s)

    def wait_event(self, method, timeout_s=None, session=None):
        """Waits for (and consumes) the next event named method; returns its params."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            for i, ev in enumerate(self.events):
                if ev.get("method") == method and (session is None or ev.get("sessionId") == session):
                    del self.events[i]
                    return ev.get("params", {})
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no %s event" % method)
            self._pump(left)

    # -- page API -------------------------------------------------------------------

    def open(self, url, timeout_s=None):
        """Opens url in a new tab (the one later calls act on); waits for its load event."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        self.target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": self.target, "flatten": True})["sessionId"]
        self.page("Page.enable")
        self.page("Runtime.enable")
        self.page("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                   "mobile": False})
        self.navigate(url, timeout_s)
        return self

    def navigate(self, url, timeout_s=None):
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
        res = self.page("Page.navigate", {"url": url}, timeout_s)
        if res.get("errorText"):
            raise BrowserError("cannot load %s: %s" % (url, res["errorText"]))
        self.wait_event("Page.loadEventFired", timeout_s, self.session)

    def evaluate(self, expr, timeout_s=None):
        """The value of a JS expression (promises awaited); raises BrowserError on a throw."""
        res = self.page("Runtime.evaluate",
                        {"expression": expr, "returnByValue": True, "awaitPromise": True,
                         "userGesture": True}, timeout_s)
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text", "exception")
            raise BrowserError("JS error in %r: %s" % (expr[:200], text))
        return res.get("result", {}).get("value")

    def wait_for(self, expr, timeout_s=10.0, poll_s=0.25):
        """Polls expr until it is truthy and returns it; TimeoutError with the last value."""
        deadline = time.monotonic() + timeout_s
        last = None
        while True:
            try:
                last = self.evaluate(expr, max(1.0, deadline - time.monotonic()))
            except BrowserError as e:
                last = e
            else:
                if last:
                    return last
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("%s: still %r after %.1f s" % (expr[:200], last, timeout_s))
            # Keep reading the pipe while waiting (dialogs, events).
            end = time.monotonic() + min(poll_s, left)
            while time.monotonic() < end:
                self._pump(end - time.monotonic())

    def _element(self, selector):
        return "(() => { const e = document.querySelector(%s); " \
               "if (!e) throw new Error('no element ' + %s); return e; })()" % (
                   json.dumps(selector), json.dumps(selector))

    def click(self, selector):
        """element.click() on the first match (a confirm() it opens is accepted)."""
        self.evaluate("%s.click(), true" % self._element(selector))

    def type(self, selector, text):
        """Sets the value of an input and dispatches input and change events."""
        self.evaluate("(e => { e.focus(); e.value = %s; "
                      "e.dispatchEvent(new Event('input', {bubbles: true})); "
                      "e.dispatchEvent(new Event('change', {bubbles: true})); return true; })(%s)"
                      % (json.dumps(text), self._element(selector)))

    def text(self, selector):
        return self.evaluate("%s.textContent" % self._element(selector))

    def screenshot(self, path, full_page=True):
        """Saves a PNG of the page (the whole scroll height when full_page)."""
        params = {"format": "png"}
        if full_page:
            m = self.page("Page.getLayoutMetrics")
            size = m.get("cssContentSize") or m.get("contentSize")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "scale": 1,
                                "width": max(self.width, int(size["width"])),
                                "height": max(self.height, int(size["height"]))})
        data = self.page("Page.captureScreenshot", params)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path


def can_start(timeout_s=30.0):
    """(True, "") when a headless Chromium starts here and evaluates 1+1, else (False, why)."""
    binary = find_binary()
    if not binary:
        return False, "no Chromium binary (tried %s)" % ", ".join(CANDIDATES)
    b = None
    try:
        b = Browser(binary, timeout_s=timeout_s)
        b.open("about:blank")
        v = b.evaluate("1+1")
        if v != 2:
            return False, "1+1 gave %r" % (v,)
        return True, ""
    except Exception as e:  # noqa: BLE001 -- any failure means: cannot start here
        why = "%s: %s" % (type(e).__name__, e)
        if b is not None and not isinstance(e, BrowserError):
            tail = b.log_tail(400).strip()
            why += (": " + tail) if tail else ""
        return False, why
    finally:
        if b is not None:
            b.close()


def main(argv):
    if len(argv) not in (3, 4):
        sys.stderr.write("usage: browser.py URL OUT.png [WAIT_S]\n")
        return 2
    wait_s = float(argv[3]) if len(argv) == 4 else 2.0
    with Browser() as b:
        b.open(argv[1])
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            b._pump(end - time.monotonic())
        b.screenshot(argv[2])
        for err in b.errors:
            sys.stderr.write("page error: %s\n" % err)
    print(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
