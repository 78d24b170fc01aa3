// Drives the exception panel in Debian's headless Chromium, as a person
// would: enters the API token (reads need it), finds a review case in the
// queue, opens it, checks its timeline,
// resolves it with actor, note and token, and waits until the page shows
// the decision applied. Run by tests/http.rs; prints one JSON line.
//
// usage: node panel.mjs URL OPERATION_ID DECISION TOKEN SCREENSHOT_DIR
import { drive } from "./launch.mjs";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const [url, operationId, decision, token, shots] = process.argv.slice(2);
if (!shots) {
  console.error("usage: node panel.mjs URL OPERATION_ID DECISION TOKEN SCREENSHOT_DIR");
  process.exit(2);
}
mkdirSync(shots, { recursive: true });
await drive(shots, async (page, result) => {
  await page.goto(url);
  // The instance has a token: the queue stays empty, saying why, until
  // the token is entered at the top.
  const refused = page.locator("#queue-error", { hasText: "401" });
  await refused.waitFor({ timeout: 20000 });
  result.before_token = await refused.innerText();
  await page.fill("#token", token);
  await page.click("#token-use");
  const row = page.locator(`#queue-body tr[data-operation-id="${operationId}"]`);
  await row.waitFor({ timeout: 20000 });
  result.queue_rows = await page.locator("#queue-body tr").count();
  result.row_text = (await row.innerText()).replace(/\s+/g, " ").trim();
  await page.screenshot({ path: join(shots, "1-queue.png"), fullPage: true });

  await row.click();
  await page.locator("#d-id", { hasText: operationId }).waitFor({ timeout: 10000 });
  await page.locator("#d-timeline tr").first().waitFor({ timeout: 10000 });
  result.timeline_rows = await page.locator("#d-timeline tr").count();
  result.reason = await page.locator("#d-reason").innerText();
  result.decisions = await page.locator("#r-decision option").allInnerTexts();
  result.preselected_decision = await page.inputValue("#r-decision");

  await page.selectOption("#r-decision", decision);
  await page.fill("#r-actor", "browser-test");
  await page.fill("#r-note", "Checked the destination record by hand in the browser test.");
  await page.fill("#r-evidence", "crm record, panel timeline");
  // A wrong token first: the page must say so, and publish nothing.
  await page.fill("#r-token", "not-the-token");
  await page.click("#r-submit");
  const wrong = page.locator("#resolve-result .error");
  await wrong.waitFor({ timeout: 10000 });
  result.wrong_token = await wrong.innerText();
  await page.fill("#r-token", token);
  await page.screenshot({ path: join(shots, "2-operation.png"), fullPage: true });
  await page.click("#r-submit");
  const applied = page.locator("#resolve-applied");
  await applied.waitFor({ timeout: 30000 });
  result.applied = await applied.innerText();
  result.state = await page.locator("#d-facts dd").first().innerText();
  await page.screenshot({ path: join(shots, "3-resolved.png"), fullPage: true });
  result.queue_rows_after = await page.locator("#queue-body tr").count();
});
