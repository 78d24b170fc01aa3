// What the browser scripts share: Debian's headless Chromium, a page of
// the panel's size, and every console error and page error collected.
import { chromium } from "playwright-core";

/** The browser, a page and the list its errors are collected into. */
export async function launch() {
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
  return { browser, page, consoleErrors };
}
