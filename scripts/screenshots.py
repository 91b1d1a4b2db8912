"""Make the documentation's screenshots (docs/screenshots/*.png) from the browser test's flow.

Starts the app headless (``tests.e2e.flow.served_app``), opens it in Debian's chromium and runs the
steps of ``tests/e2e/flow.py``, each of which saves its page. Needs the test extras
(``bash scripts/install.sh --test``: pytest-playwright and chromium).

Command: ``.venv/bin/python scripts/screenshots.py [--out docs/screenshots]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from tests.e2e.flow import CHROMIUM, CHROMIUM_FLAGS, SHOTS, open_app, run_flow, served_app  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots", help="folder for the PNG files")
    args = p.parse_args(argv)
    if CHROMIUM is None:
        print("Debian's chromium is not installed (apt-get install chromium).", file=sys.stderr)
        return 2
    with served_app() as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            context, page = open_app(browser, url)
            run_flow(page, args.out)
            context.close()
        finally:
            browser.close()
    for name in SHOTS:
        print(args.out / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
