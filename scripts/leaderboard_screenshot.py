"""Screenshot of a leaderboard site's overview, in headless Chromium (for the README).

    python scripts/leaderboard_screenshot.py SITE_DIR OUT.png [--width 1300] [--height 900]

Needs Selenium and Debian's chromium + chromium-driver (/usr/bin/chromium,
/usr/bin/chromedriver).
"""
import os
import shutil

from oodutils.cli import ArgumentParser, add_option
from oodutils.errors import UserError, run_cli


def find(*names):
    for name in names:
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.path.exists(path):
            return path
    return None


def main(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("site")
    p.add_argument("out")
    add_option(p, "--width", type=int, default=1300)
    add_option(p, "--height", type=int, default=900)
    args = p.parse_args(argv)
    index = os.path.abspath(os.path.join(args.site, "index.html"))
    if not os.path.isfile(index):
        raise UserError(f"{args.site!r} holds no index.html (build it with "
                        "python -m domainbed.scripts.leaderboard)")
    chromium = find("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
    driver_path = find("/usr/bin/chromedriver", "chromedriver")
    if not chromium or not driver_path:
        raise UserError("no chromium and chromedriver found (apt-get install chromium "
                        "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                f"--window-size={args.width},{args.height}"):
        options.add_argument(arg)
    options.binary_location = chromium
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get("file://" + index)
        driver.save_screenshot(args.out)
    finally:
        driver.quit()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_cli(main)
