#!/usr/bin/env python3
"""The pictures of the documentation site, from a real run (nothing drawn by hand):

    .venv/bin/python scripts/screenshots.py            # writes docs/img/live-view.png and docs/img/report.png

It starts a local HTTP server on 127.0.0.1, runs the bundled experiment `basic/stop-http-server` against it
(SIGSTOP of the server for 3 s: the latency probe fails during the fault, then the server recovers) inside a
private tmux server (120x36), captures the live view with `tmux capture-pane -e` while the fault is in effect,
renders the captured text and colours to HTML and screenshots it with headless Chromium; then screenshots the
report.html that run wrote. Needs tmux and chromium (scripts/setup.sh installs both as root).

--report FILE --name NAME.png screenshots a report.html a run already wrote instead (the report with time to
detect per fault: `CHAOSKIT_KEEP_REPORT=/tmp/ttd .venv/bin/python -m pytest -q
tests/integration/test_observe_stack.py -k prometheus_has_the_fault_window`, then
`--report /tmp/ttd/report.html --name report-detection.png --section Faults`).

--src DIR runs chaoskit from another source tree (PYTHONPATH), e.g. a `git archive HEAD` copy while the
checkout is half edited. Everything it starts is stopped and its temporary directory removed at the end.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLS, ROWS = 120, 36
# The 16 colours of xterm (what tmux capture-pane -e writes as SGR 30-37/90-97).
PALETTE = ["#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
           "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def color256(n: int) -> str:
    if n < 16:
        return PALETTE[n]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return f"#{steps[n // 36]:02x}{steps[(n // 6) % 6]:02x}{steps[n % 6]:02x}"
    v = 8 + (n - 232) * 10
    return f"#{v:02x}{v:02x}{v:02x}"


def ansi_to_html(text: str) -> str:
    """Terminal text with SGR escapes (colours, bold, dim, reverse) as HTML spans."""
    out: list[str] = []
    fg = bg = None
    bold = dim = reverse = False
    pos = 0
    for m in re.finditer(r"\x1b\[([0-9;]*)m", text):
        out.append(html.escape(text[pos:m.start()]))
        pos = m.end()
        codes = [int(c) if c else 0 for c in m.group(1).split(";")]
        i = 0
        while i < len(codes):
            c = codes[i]
            if c == 0:
                fg = bg = None
                bold = dim = reverse = False
            elif c == 1:
                bold = True
            elif c == 2:
                dim = True
            elif c == 7:
                reverse = True
            elif c == 22:
                bold = dim = False
            elif c == 27:
                reverse = False
            elif 30 <= c <= 37 or 90 <= c <= 97:
                fg = PALETTE[c - 30 if c < 90 else c - 82]
            elif 40 <= c <= 47 or 100 <= c <= 107:
                bg = PALETTE[c - 40 if c < 100 else c - 92]
            elif c == 39:
                fg = None
            elif c == 49:
                bg = None
            elif c in (38, 48) and i + 1 < len(codes):
                if codes[i + 1] == 5 and i + 2 < len(codes):
                    col = color256(codes[i + 2])
                    i += 2
                elif codes[i + 1] == 2 and i + 4 < len(codes):
                    col = "#{:02x}{:02x}{:02x}".format(*codes[i + 2:i + 5])
                    i += 4
                else:
                    col = None
                if c == 38:
                    fg = col
                else:
                    bg = col
            i += 1
        f, b = (bg or "#1e1e1e", fg or "#d4d4d4") if reverse else (fg, bg)
        style = "".join([f"color:{f};" if f else "", f"background:{b};" if b else "",
                         "font-weight:bold;" if bold else "", "opacity:0.6;" if dim else ""])
        out.append(f'</span><span style="{style}">')
    out.append(html.escape(text[pos:]))
    return "<span>" + "".join(out) + "</span>"


def terminal_page(captured: str) -> str:
    return ("<!doctype html><html><head><meta charset='utf-8'><title>chaoskit live view</title><style>"
            "body{margin:0;background:#1e1e1e}"
            "pre{margin:0;padding:14px 16px;color:#d4d4d4;font:14px/1.25 'DejaVu Sans Mono',monospace}"
            "</style></head><body><pre>" + ansi_to_html(captured) + "</pre></body></html>")


def chromium_screenshot(chromium: str, url: str, png: Path, size: tuple[int, int], tmp: Path) -> None:
    profile = tempfile.mkdtemp(prefix="profile-", dir=tmp)
    subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--no-first-run", "--disable-extensions", "--disable-background-networking", "--disable-sync",
                    f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                    f"--screenshot={png}", url],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    if not png.is_file() or png.stat().st_size < 1000:
        raise SystemExit(f"screenshots: chromium wrote no picture for {url}")


def shoot_report(chromium: str | None, report: Path, png: Path, section: str | None) -> int:
    """A screenshot of a report; `section`: its title, then the section with that heading on (a copy of the page
    whose sections before it are left out)."""
    if not chromium or not report.is_file():
        raise SystemExit(f"screenshots: needs chromium and an existing report ({report})")
    with tempfile.TemporaryDirectory(prefix="chaoskit-shots-") as tmp:
        page = report.resolve()
        if section:
            page = Path(tmp) / "report.html"
            scroll = ("<script>{const hs=[...document.querySelectorAll('h2')];"
                      f"const t=hs.find(h=>h.textContent=={section!r});"
                      "let n=t?hs[0]:null;while(n&&n!==t){const nx=n.nextElementSibling;n.remove();n=nx;}}</script>")
            page.write_text(report.read_text().replace("</body>", scroll + "</body>"))
        chromium_screenshot(chromium, page.as_uri(), png, (1280, 900), Path(tmp))
    print(f"screenshots: {png} ({png.stat().st_size} bytes)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the PNGs go (docs/img)")
    ap.add_argument("--src", type=Path, help="run chaoskit from this source tree instead of the checkout")
    ap.add_argument("--report", type=Path, help="only screenshot this report.html (with --name)")
    ap.add_argument("--name", default="report.png", help="the PNG's name for --report")
    ap.add_argument("--section", help="with --report: scroll to the section with this heading (e.g. Faults)")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if args.report:
        return shoot_report(chromium, args.report, args.out / args.name, args.section)
    tmux = shutil.which("tmux")
    if not chromium or not tmux:
        raise SystemExit("screenshots: needs chromium and tmux (scripts/setup.sh installs them as root)")
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="chaoskit-shots-"))
    sock = f"chaoskit-shots-{os.getpid()}"  # a private tmux server: no session of yours is touched
    server = None
    try:
        (tmp / "www").mkdir()
        (tmp / "www" / "index.html").write_text("ok\n")
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                   "--directory", str(tmp / "www")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("screenshots: the HTTP server did not start") from None
                time.sleep(0.1)
        env = [f"CHAOSKIT_STATE_DIR={tmp / 'state'}", "TERM=xterm-256color", "COLORTERM=truecolor"]
        if args.src:
            env.append(f"PYTHONPATH={args.src.resolve()}")
        # the experiment names the server by its command line: `python -m http.server PORT ...`
        # a copy in the run's directory, so the report names the file as a user's own (not this checkout's path)
        src = (args.src or ROOT).resolve() / "experiments" / "basic" / "stop-http-server.yaml"
        shutil.copy2(src, tmp / "stop-http-server.yaml")
        run = [str(ROOT / ".venv" / "bin" / "python"), "-m", "chaoskit", "run", "stop-http-server.yaml",
               "--var", f"port={port}", "--out", str(tmp / "run")]
        subprocess.run([tmux, "-L", sock, "-f", "/dev/null", "new-session", "-d", "-s", "run", "-x", str(COLS),
                        "-y", str(ROWS), *sum((["-e", e] for e in env), []),
                        " ".join(run) + "; echo chaoskit-exit=$?; sleep 600"], check=True, cwd=tmp)
        best = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            frame = subprocess.run([tmux, "-L", sock, "capture-pane", "-p", "-e", "-t", "run"],
                                   capture_output=True, text=True, check=True).stdout
            plain = re.sub(r"\x1b\[[0-9;]*m", "", frame)
            if not best and "process.signal" in plain and re.search(r"during [1-9]\d*/", plain):
                best = frame  # the first frame with the fault in effect and a failed sample during it
            if "chaoskit-exit=" in plain:
                break
            time.sleep(0.2)
        else:
            raise SystemExit("screenshots: the run did not end within 90 s")
        if not best:
            raise SystemExit("screenshots: no frame showed the fault in effect with a failed sample")
        code = re.search(r"chaoskit-exit=(\d+)", plain)
        if not code or code.group(1) != "1":
            raise SystemExit(f"screenshots: the run should deviate (exit 1); the pane says:\n{plain}")
        lines = best.rstrip("\n").split("\n")
        while lines and not re.sub(r"\x1b\[[0-9;]*m", "", lines[-1]).strip():
            lines.pop()
        page = tmp / "live-view.html"
        page.write_text(terminal_page("\n".join(lines)))
        height = 28 + len(lines) * 18 + 4
        chromium_screenshot(chromium, page.as_uri(), args.out / "live-view.png", (COLS * 9 - 40, height), tmp)
        report = tmp / "run" / "report.html"
        chromium_screenshot(chromium, report.as_uri(), args.out / "report.png", (1280, 1150), tmp)
        for name in ("live-view.png", "report.png"):
            print(f"screenshots: {args.out / name} ({(args.out / name).stat().st_size} bytes)")
        return 0
    finally:
        subprocess.run([tmux, "-L", sock, "kill-server"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if server is not None:
            server.kill()
            server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
