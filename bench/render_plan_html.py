"""Render plan.html in headless Chromium and check that the PNG is not blank.

    python bench/render_plan_html.py [PLAN_DIR ...] [--out DIR] [--width 1400] [--height 1800]

Without PLAN_DIR it plans the tiny DiT first (`wancompile plan --model tiny --mesh 2x4 --hardware
wh-loudbox --resolution tiny --frames 9 --memory-gb 0.00025`). For each plan.html it writes
``plan.png`` next to it (or under --out), then prints what the image holds: size, the share of
non-white pixels, distinct colours, and which of the diagram's state colours and collective-badge
colours appear — a blank or unstyled page fails. Needs ``chromium`` (Debian: apt-get install
chromium); CI does not run this (tests/test_report.py checks the HTML itself).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_png(path: Path) -> tuple[int, int, list[tuple[int, ...]]]:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) without third-party packages."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
            depth, ctype, interlace = body[8], body[9], body[12]
            assert depth == 8 and ctype in (2, 6) and interlace == 0, "only 8-bit RGB(A) non-interlaced PNGs"
            channels = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * channels
    pixels: list[tuple[int, ...]] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels.extend(tuple(line[x : x + 3]) for x in range(0, stride, channels))
        prev = line
    return width, height, pixels


def render(html: Path, png: Path, width: int, height: int) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not chromium:
        raise SystemExit("chromium not found; install it (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                f"--screenshot={png}",
                f"--window-size={width},{height}",
                html.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def inspect(png: Path) -> dict:
    from wancompile.report.html import COMM, COMPUTE, PALETTE

    w, h, px = read_png(png)
    hexes = {"#%02x%02x%02x" % p for p in px}
    nonwhite = sum(1 for p in px if min(p) < 245) / len(px)
    return {
        "size": (w, h),
        "non_white": nonwhite,
        "colours": len(hexes),
        "state_colours": sorted(c for c in PALETTE if c in hexes),
        "bars": [c for c in (COMPUTE, COMM) if c in hexes],
        "big_badge": "#c0392b" in hexes,
        "small_badge": "#f6c9a8" in hexes,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="*")
    ap.add_argument("--out", default=None)
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1800)
    args = ap.parse_args()
    dirs = [Path(p) for p in args.plans]
    if not dirs:
        from wancompile.cli import main as cli

        d = Path(args.out or tempfile.mkdtemp(prefix="wancompile-html-")) / "tiny-2x4"
        cli(
            [
                "plan",
                "--model",
                "tiny",
                "--mesh",
                "2x4",
                "--hardware",
                "wh-loudbox",
                "--resolution",
                "tiny",
                "--frames",
                "9",
                "--memory-gb",
                "0.00025",
                "--out",
                str(d),
            ]
        )
        dirs = [d]
    bad = 0
    print(f"{'plan.html':<48} {'size':>11} {'non-white':>9} {'colours':>7}  states bars badges(big/small)")
    for d in dirs:
        html = d / "plan.html" if d.is_dir() else d
        png = (Path(args.out) / f"{html.parent.name}.png") if args.out and args.plans else html.with_suffix(".png")
        render(html, png, args.width, args.height)
        r = inspect(png)
        ok = r["non_white"] > 0.03 and len(r["state_colours"]) >= 2 and r["bars"] and r["big_badge"]
        bad += not ok
        print(
            f"{str(html)[-48:]:<48} {r['size'][0]:>5}x{r['size'][1]:<5} {r['non_white']:>8.1%} {r['colours']:>7}  "
            f"{len(r['state_colours']):>6} {len(r['bars']):>4} {r['big_badge']!s:>5}/{r['small_badge']!s:<5} "
            f"{'ok' if ok else 'BLANK OR UNSTYLED'}  -> {png}"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
