"""A page rendered by a real browser: headless Chromium driven over a pipe.

``render(path)`` opens an HTML file in headless Chromium and returns what the
browser made of it (``Rendered``): the DOM after parsing (what ``chromium
--dump-dom`` prints), every URL the page asked the network stack for, and each
``<img>`` as the browser decoded it. ``Rendered.outside`` lists the requests
that were not the page itself nor a ``data:`` URI: a self-contained page has
none. ``outside_references(text)`` is the same question asked of the HTML
source without a browser (``html.parser``): every ``src``/``href``, every CSS
``url(...)`` must be a ``data:`` URI or an anchor of the same document.

The browser is driven with the DevTools protocol over ``--remote-debugging-pipe``
(JSON messages ended by a NUL byte on file descriptors 3 and 4), so nothing
beyond the standard library is needed and no port is opened. The Network
domain reports the page's own requests (not the browser's background traffic)
from the moment the page starts loading; ``Page.navigate`` is sent only once it
is enabled, so no request comes too early to be seen. Nothing leaves the
machine: every host name resolves to nothing and every connection goes to a
proxy on a closed local port, so a request to the network is made (and
recorded) and fails at once.

Chromium is looked up on PATH (``chromium``, ``chromium-browser``,
``google-chrome``); ``JAXMESH_CHROMIUM`` names another binary. On Debian:
``apt-get install chromium``.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

#: Set in CI (.ci/run): a missing browser fails the test instead of skipping it.
CI_ENV = "JAXMESH_CI"
#: Names another Chromium binary.
BINARY_ENV = "JAXMESH_CHROMIUM"
NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL = "apt-get install chromium"

FLAGS = (
    "--headless",
    # The page is the test's own file; the sandbox needs user namespaces that
    # containers (and root) often lack.
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
    # Nothing reaches the network: names resolve to nothing and connections go
    # to a closed port (an IP literal is not resolved, so both).
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=http://127.0.0.1:9",
    "--remote-debugging-pipe",
)

#: What the page's images became once the browser decoded them.
IMAGES_JS = """[...document.images].map(i => ({
  src: i.currentSrc || i.src, complete: i.complete,
  width: i.naturalWidth, height: i.naturalHeight}))"""


#: How the page lays out: the document's scroll width, the viewport's width,
#: every visible element whose box reaches past the viewport's right edge (or
#: starts left of 0), and each video's displayed size.
LAYOUT_JS = """(() => {
  const vw = document.documentElement.clientWidth;
  const past = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.right > vw + 0.5 || r.left < -0.5) {
      past.push({tag: el.tagName.toLowerCase(), id: el.id,
                 text: (el.textContent || '').slice(0, 80),
                 left: r.left, right: r.right});
    }
  }
  const videos = [...document.querySelectorAll('video')].map(v => {
    const r = v.getBoundingClientRect();
    return {width: r.width, height: r.height, controls: v.controls,
            natural: [v.videoWidth, v.videoHeight]};
  });
  return {scrollWidth: document.documentElement.scrollWidth, viewport: vw,
          past, videos};
})()"""


def chromium() -> str | None:
    """The Chromium binary to run, or None when none is installed."""
    named = os.environ.get(BINARY_ENV)
    if named:
        return shutil.which(named) or named
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def require_chromium() -> str:
    """The Chromium binary; skips the test without one, fails it in CI."""
    import pytest

    found = chromium()
    if found is not None:
        return found
    why = f"no Chromium on PATH ({', '.join(NAMES)}); install it: {INSTALL}"
    if os.environ.get(CI_ENV):
        pytest.fail(f"{why} ({CI_ENV} is set: CI must render the report)")
    pytest.skip(why)


@dataclass
class Rendered:
    """What the browser made of a page."""

    #: The page's own URL (``file://...``).
    url: str
    #: ``document.documentElement.outerHTML`` once the page has loaded.
    dom: str
    #: Every URL the page requested, in order (the page's own URL first).
    requests: list[str]
    #: Each ``<img>`` as decoded: ``src``, ``complete``, ``width``, ``height``
    #: (natural size in pixels; 0 when it did not decode).
    images: list[dict[str, Any]] = field(default_factory=list)
    #: ``LAYOUT_JS``'s answer when rendered with ``width=``, else None.
    layout: dict[str, Any] | None = None

    @property
    def outside(self) -> list[str]:
        """Requests for anything but the page itself and ``data:`` URIs."""
        return [
            u
            for u in self.requests
            if u.split("#")[0] != self.url and not u.startswith("data:")
        ]


_EXEC_ON_3_AND_4 = """
import os, sys
os.dup2(int(sys.argv[1]), 3)
os.dup2(int(sys.argv[2]), 4)
os.execv(sys.argv[3], sys.argv[3:])
"""


def _above_9(fd: int) -> int:
    """``fd`` moved to a descriptor number of 10 or more."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class _Pipe:
    """The DevTools protocol over Chromium's ``--remote-debugging-pipe``."""

    def __init__(self, binary: str, profile: str, log: Any):
        to_child, self._write = os.pipe()  # we write, Chromium reads fd 3
        self._read, from_child = os.pipe()  # Chromium writes fd 4
        # A small Python puts the pipes on fds 3 and 4 and becomes Chromium (no
        # preexec_fn: the test process runs threads). The pipes are moved above
        # 9 first, so that neither dup2 overwrites the other's source.
        to_child, from_child = (_above_9(fd) for fd in (to_child, from_child))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _EXEC_ON_3_AND_4,
                str(to_child),
                str(from_child),
                binary,
                *FLAGS,
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            pass_fds=(to_child, from_child),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str = "") -> int:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method}
        message["params"] = params or {}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        return self._id

    def receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._read], [], [], max(left, 0))
            if not ready:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed its DevTools pipe (it exited)")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def call(self, method, params=None, session="", *, deadline: float) -> dict:
        sent = self.send(method, params, session)
        while True:
            message = self.receive(deadline)
            if message.get("id") == sent:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait(self, done, *, deadline: float) -> None:
        """Reads events until ``done(events)`` holds."""
        while not done(self.events):
            self.events.append(self.receive(deadline))

    def close(self) -> None:
        try:
            self.send("Browser.close")
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            os.close(self._write)
            os.close(self._read)


def render(
    path: str | Path, *, timeout: float = 60.0, width: int | None = None
) -> Rendered:
    """Loads ``path`` in headless Chromium and returns what it rendered.

    Waits for the load event and for the network to go quiet (Chromium's
    ``networkIdle``: no request in flight for 0.5 s), so requests made late
    (a CSS background, a font) are seen too.

    Raises:
      FileNotFoundError: no Chromium installed (``require_chromium`` first).
      TimeoutError: the page did not load within ``timeout`` seconds.

    ``width``: lay the page out in a viewport that many CSS pixels wide (800
    high, scale 1) and measure it (``Rendered.layout``).
    """
    binary = chromium()
    if binary is None:
        raise FileNotFoundError(f"no Chromium on PATH; install it: {INSTALL}")
    url = Path(path).resolve().as_uri()
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory() as profile:
        with open(Path(profile).parent / f"{Path(profile).name}.log", "w") as log:
            pipe = _Pipe(binary, profile, log)
            try:
                return _load(pipe, url, deadline, width)
            except (TimeoutError, EOFError, BrokenPipeError) as e:
                log.flush()
                tail = Path(log.name).read_text(errors="replace")[-2000:]
                raise type(e)(f"{e}; Chromium's output:\n{tail}") from e
            finally:
                pipe.close()
                Path(log.name).unlink(missing_ok=True)


def _load(pipe: _Pipe, url: str, deadline: float, width: int | None) -> Rendered:
    target = pipe.call("Target.createTarget", {"url": "about:blank"}, deadline=deadline)
    session = pipe.call(
        "Target.attachToTarget",
        {"targetId": target["targetId"], "flatten": True},
        deadline=deadline,
    )["sessionId"]
    for method in ("Network.enable", "Page.enable"):
        pipe.call(method, session=session, deadline=deadline)
    pipe.call(
        "Page.setLifecycleEventsEnabled",
        {"enabled": True},
        session,
        deadline=deadline,
    )
    if width is not None:
        metrics = {"width": width, "height": 800, "deviceScaleFactor": 1}
        pipe.call(
            "Emulation.setDeviceMetricsOverride",
            {**metrics, "mobile": False},
            session,
            deadline=deadline,
        )
    pipe.events.clear()  # about:blank's own events
    frame = pipe.call("Page.navigate", {"url": url}, session, deadline=deadline)
    if "errorText" in frame:
        raise RuntimeError(f"Chromium could not open {url}: {frame['errorText']}")

    def loaded(events):
        names = {
            e["params"]["name"]
            for e in events
            if e.get("method") == "Page.lifecycleEvent"
            and e["params"].get("frameId") == frame["frameId"]
        }
        return {"load", "networkIdle"} <= names

    pipe.wait(loaded, deadline=deadline)

    def evaluate(expression):
        answer = pipe.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True},
            session,
            deadline=deadline,
        )
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression!r}: {answer['exceptionDetails']}")
        return answer["result"]["value"]

    dom = evaluate("document.documentElement.outerHTML")
    images = evaluate(IMAGES_JS)
    requests = [
        e["params"]["request"]["url"]
        for e in pipe.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    layout = None if width is None else evaluate(LAYOUT_JS)
    return Rendered(url, dom, requests, images, layout)


# Without a browser -------------------------------------------------------------
_CSS_URL = re.compile(r"""url\(\s*(['"]?)(.*?)\1\s*\)""", re.IGNORECASE | re.DOTALL)
_CSS_IMPORT = re.compile(r"""@import\s+(['"])(.*?)\1""", re.IGNORECASE)
#: Attributes that load something or lead somewhere.
URL_ATTRIBUTES = ("src", "href", "srcset", "poster", "data", "action", "background")


class _References(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self.ids: set[str] = set()
        self._style = False

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            value = value or ""
            if name == "id":
                self.ids.add(value)
            elif name in URL_ATTRIBUTES:
                if name == "srcset":
                    self.found += [c.split()[0] for c in value.split(",") if c.strip()]
                else:
                    self.found.append(value.strip())
            elif name == "style":
                self.found += _css_urls(value)
        self._style = tag == "style"

    def handle_endtag(self, tag):
        self._style = False

    def handle_data(self, data):
        if self._style:
            self.found += _css_urls(data)


def _css_urls(css: str) -> list[str]:
    found = [*_CSS_URL.finditer(css), *_CSS_IMPORT.finditer(css)]
    return [m.group(2).strip() for m in found]


def outside_references(text: str) -> list[str]:
    """The references of an HTML page to anything outside it.

    Every ``src``, ``href`` (and the other URL attributes), ``srcset`` entry
    and CSS ``url(...)``/``@import`` (in ``<style>`` and ``style=``) must be a
    ``data:`` URI or ``#id`` of an element of the page; the rest are returned
    (an anchor to a missing id too).
    """
    parser = _References()
    parser.feed(text)
    parser.close()
    out = []
    for ref in parser.found:
        if ref.startswith("data:"):
            continue
        if ref.startswith("#") and ref[1:] in parser.ids:
            continue
        out.append(ref)
    return out


def data_uri_bytes(uri: str) -> tuple[str, bytes]:
    """``(media type, bytes)`` of a base64 ``data:`` URI."""
    head, sep, data = uri.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise ValueError(f"not a base64 data: URI: {uri[:60]!r}")
    return head[len("data:") : -len(";base64")], base64.b64decode(data, validate=True)
