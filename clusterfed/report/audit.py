"""What a report file refers to, read back with html.parser: every URL-bearing attribute, the
embedded images, and the client column of its Clients table (for the self-containment
checks of the tests and ``make check-report``), and its rendering in headless Chromium."""

from __future__ import annotations

import base64
import binascii
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

PNG_PREFIX = "data:image/png;base64,"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
URL_ATTRIBUTES = ("src", "href", "srcset", "action", "poster", "data", "formaction")


class ReportAudit(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.images: list[str] = []  # img src values
        self.clients: list[str] = []  # first cell of each row of the table under <h2>Clients</h2>
        self._heading: str | None = None
        self._section = ""
        self._cell = 0
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in URL_ATTRIBUTES and value is not None:
                self.urls.append((tag, name, value))
                if tag == "img" and name == "src":
                    self.images.append(value)
        if tag == "h2":
            self._heading = ""
        elif tag == "tr":
            self._cell = 0
        elif tag == "td":
            self._in_cell = True
            self._cell += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self._section, self._heading = self._heading or "", None
        elif tag == "td":
            self._in_cell = False
        elif tag == "table":
            self._section = ""

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self._heading += data
        elif self._section == "Clients" and self._in_cell and self._cell == 1:
            self.clients.append(data)

    def external_urls(self) -> list[tuple[str, str, str]]:
        """URLs that leave the file (anything but an embedded PNG or an in-page anchor)."""
        return [u for u in self.urls if not u[2].startswith(PNG_PREFIX) and not u[2].startswith("#")]

    def pngs(self) -> list[bytes]:
        """The embedded images' bytes; raises ValueError for one that is not base64 PNG."""
        out = []
        for src in self.images:
            if not src.startswith(PNG_PREFIX):
                raise ValueError(f"image {src[:40]!r} is not an embedded PNG")
            try:
                data = base64.b64decode(src[len(PNG_PREFIX):], validate=True)
            except binascii.Error as error:
                raise ValueError(f"an embedded image is not valid base64: {error}") from None
            if not data.startswith(PNG_SIGNATURE):
                raise ValueError("an embedded image lacks the PNG signature")
            out.append(data)
        return out


def audit(text: str) -> ReportAudit:
    parser = ReportAudit()
    parser.feed(text)
    parser.close()
    return parser


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def screenshot(html: str | Path, png: str | Path, width: int = 1280, height: int = 2000,
               timeout: float = 120.0) -> Path:
    """Render ``html`` in headless Chromium into ``png`` (``width`` × ``height`` pixels).
    Raises FileNotFoundError when no Chromium is on PATH."""
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError("no chromium on PATH (Debian: apt-get install chromium)")
    png = Path(png)
    # --no-sandbox: Chromium refuses to run as root with its sandbox (containers, CI)
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={png.resolve()}", f"--window-size={width},{height}", Path(html).resolve().as_uri()],
                   check=True, capture_output=True, timeout=timeout)
    return png
