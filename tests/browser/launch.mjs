// What the browser scripts share: Debian's headless Chromium, a page of
// the panel's size, every console and page error collected, and the end
// of a run: a screenshot and the visible errors when a step failed, one
// JSON line of results, the exit code.
import { chromium } from "playwright-core";
import { join } from "node:path";

/** Runs `steps(page, result)` in a fresh browser, then prints `result` as
 * one JSON line and exits 0 if every step passed, else 1. */
export async function drive(shots, steps) {
  const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
  const browser = await chromium.launch({
    executablePath,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const consoleErrors = [];
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  const result = { ok: false };
  try {
    await steps(page, result);
    result.ok = true;
  } catch (e) {
    result.error = String(e && e.message ? e.message : e);
    try {
      result.page_errors = await page.locator(".error:not([hidden])").allInnerTexts();
      await page.screenshot({ path: join(shots, "failure.png"), fullPage: true });
    } catch (_) { /* the page is gone */ }
  } finally {
    result.console_errors = consoleErrors;
    await browser.close();
  }
  console.log(JSON.stringify(result));
  process.exit(result.ok ? 0 : 1);
}
