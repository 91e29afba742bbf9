"""Headless Chromium for the report's tests: a screenshot of a page with its console lines
(:func:`chromium`), a driver over the DevTools protocol with real mouse, wheel and key events,
page evaluation, screenshots and every console message and exception (:class:`Browser`, on
--remote-debugging-pipe: no driver package), and checks of what they show: a blank screenshot,
a picture's view box. Chromium is required: without it these tests fail (CI installs it).
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import zlib
from pathlib import Path

import numpy as np

CHROMIUM = "/usr/bin/chromium"


def chromium(url: str, png: Path) -> list:
    """Open ``url`` headless, screenshot it into ``png``; returns the page's console lines."""
    assert os.path.exists(CHROMIUM), "chromium is not installed (apt-get install chromium)"
    profile = tempfile.mkdtemp(prefix="paratrace-chromium-")
    try:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
             "--window-size=1000,700", f"--screenshot={png}", url],
            capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert png.exists(), f"chromium wrote no screenshot of {url}:\n{proc.stderr[-2000:]}"
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


def png_pixels(path: Path) -> np.ndarray:
    """Decode an 8-bit RGB/RGBA PNG (what Chromium writes) into an (h, w, c) array."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), f"unsupported PNG ({depth}-bit, {colour})"
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), np.int32)
    prev = np.zeros(width * channels, np.int32)
    for y in range(height):
        kind, row = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 0:
            cur = row
        elif kind == 1:
            cur = np.cumsum(row.reshape(width, channels), axis=0).reshape(-1) % 256
        elif kind == 2:
            cur = (row + prev) % 256
        else:
            cur = np.zeros_like(row)
            for x in range(len(row)):
                a = cur[x - channels] if x >= channels else 0
                b, c = prev[x], prev[x - channels] if x >= channels else 0
                if kind == 3:
                    cur[x] = (row[x] + (a + b) // 2) % 256
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                    cur[x] = (row[x] + pred) % 256
        out[y] = cur
        prev = cur
    return out.reshape(height, width, channels)


def blank(png: Path) -> bool:
    """Whether a screenshot is (nearly) one colour."""
    pixels = png_pixels(png)[:, :, :3].reshape(-1, 3)
    background = np.median(pixels, axis=0)
    differs = np.abs(pixels - background).sum(axis=1) > 30
    return differs.mean() < 0.005


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe):
    real input events, page evaluation, screenshots and every console message and exception."""

    def __init__(self, width: int = 1200, height: int = 800):
        assert os.path.exists(CHROMIUM), "chromium is not installed (apt-get install chromium)"
        self.profile = tempfile.mkdtemp(prefix="paratrace-cdp-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands on fd 3 and writes answers on fd 4: move the child's ends
        # above them first, so that setting up one cannot overwrite the other (and use bash:
        # dash redirects single-digit fds only).
        to_chrome_r, from_chrome_w = (_high_fd(fd) for fd in (to_chrome_r, from_chrome_w))
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$0" "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}', CHROMIUM,
             "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
             f"--window-size={width},{height}", "about:blank"],
            pass_fds=(to_chrome_r, from_chrome_w), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._answers: dict = {}
        self._events: queue.Queue = queue.Queue()
        self._lock = threading.Condition()
        self.console: list = []
        threading.Thread(target=self._read, daemon=True).start()
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target,
                                                           "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_chrome, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(1 << 16)
                if not chunk:
                    return
                buffer += chunk
                while b"\0" in buffer:
                    raw, buffer = buffer.split(b"\0", 1)
                    message = json.loads(raw)
                    if "id" in message:
                        with self._lock:
                            self._answers[message["id"]] = message
                            self._lock.notify_all()
                    else:
                        self._event(message)

    def _event(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled":
            self.console.append(f"console.{params['type']}: " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.console.append("exception: " + details.get("exception", {}).get(
                "description", details.get("text", "")))
        elif method == "Log.entryAdded":
            self.console.append(f"log {params['entry']['level']}: {params['entry']['text']}")
        self._events.put(message)

    def send(self, method: str, params: dict = None, session: str = None) -> dict:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        with self._lock:
            assert self._lock.wait_for(lambda: ident in self._answers, timeout=60), method
            answer = self._answers.pop(ident)
        assert "error" not in answer, f"{method}: {answer['error']}"
        return answer["result"]

    def call(self, method: str, params: dict = None) -> dict:
        return self.send(method, params, self.session)

    def open(self, url: str) -> None:
        while not self._events.empty():
            self._events.get_nowait()
        self.call("Page.navigate", {"url": url})
        while True:
            event = self._events.get(timeout=60)
            if event.get("method") == "Page.loadEventFired":
                return

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True})
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def mouse(self, kind: str, x: float, y: float, **extra) -> None:
        self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, **extra})

    def drag(self, x0: float, y0: float, x1: float, y1: float, steps: int = 5) -> None:
        self.mouse("mouseMoved", x0, y0)
        self.mouse("mousePressed", x0, y0, button="left", buttons=1, clickCount=1)
        for i in range(1, steps + 1):
            self.mouse("mouseMoved", x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps,
                       button="left", buttons=1)
        self.mouse("mouseReleased", x1, y1, button="left", buttons=0, clickCount=1)

    def wheel(self, x: float, y: float, delta_y: float) -> None:
        self.mouse("mouseWheel", x, y, deltaX=0, deltaY=delta_y)

    KEYS = {"+": ("Equal", 187), "-": ("Minus", 189), "0": ("Digit0", 48),
            "ArrowLeft": ("ArrowLeft", 37), "ArrowRight": ("ArrowRight", 39),
            "ArrowUp": ("ArrowUp", 38), "ArrowDown": ("ArrowDown", 40),
            "Enter": ("Enter", 13), "/": ("Slash", 191)}

    def key(self, key: str) -> None:
        code, vk = self.KEYS[key]
        text = key if len(key) == 1 else ("\r" if key == "Enter" else None)
        down = {"type": "keyDown" if text else "rawKeyDown", "key": key, "code": code,
                "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk}
        if text:
            down["text"] = text
        self.call("Input.dispatchKeyEvent", down)
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", "key": key, "code": code,
                                             "windowsVirtualKeyCode": vk})

    def type(self, text: str) -> None:
        self.call("Input.insertText", {"text": text})

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot",
                                                    {"format": "png"})["data"]))
        return path

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        shutil.rmtree(self.profile, ignore_errors=True)


def _high_fd(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


def fitted(view: list, svg_file: Path) -> bool:
    """Whether ``view`` shows all of the picture in ``svg_file`` and no more than it must."""
    x, y, w, h = map(float, re.search(r'viewBox="([-0-9. ]+)"', svg_file.read_text())
                     .group(1).split())
    vx, vy, vw, vh = view
    inside = vx <= x + 0.5 and vy <= y + 0.5 and vx + vw >= x + w - 0.5 and \
        vy + vh >= y + h - 0.5
    return inside and min(abs(vw - w), abs(vh - h)) < 0.5


def view_box(browser: Browser, index: int = 0) -> list:
    text = browser.js(f"document.querySelectorAll('div.svgview svg')[{index}]"
                      ".getAttribute('viewBox')")
    return [float(v) for v in text.split()]


def box_centre(browser: Browser, index: int = 0) -> tuple:
    r = browser.js(f"(() => {{ const box = document.querySelectorAll('div.svgview')[{index}];"
                   "box.scrollIntoView({block: 'nearest'}); const r = box.getBoundingClientRect();"
                   " return [r.left + r.width / 2, r.top + r.height / 2, r.width, r.height];"
                   " })()")
    return tuple(r)
