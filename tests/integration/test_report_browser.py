"""The browser driver the report's tests use (tests/support/browser.py: headless Chromium over the
DevTools protocol) sees what a page logs and throws, so a clean console in those tests means
something.
"""
from __future__ import annotations


def test_the_browser_driver_sees_console_errors(browser, tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>console.error('boom');"
                    "no_such_function();</script></body></html>")
    browser.console.clear()
    browser.open(page.as_uri())
    assert any("boom" in line for line in browser.console)
    assert any("no_such_function" in line for line in browser.console)
    browser.console.clear()
