// Drives the exception panel's Dead letters tab in Debian's headless
// Chromium, as an operator would: finds dead letters of both places (the
// DLQ topic and the outbox), selects one of each, runs a dry run, then
// re-drives them with actor, note and token, and reads the audit the page
// shows afterwards. Run by tests/integration/http.rs; prints one JSON line.
//
// usage: node dlq.mjs URL TOKEN SCREENSHOT_DIR
import { drive } from "./launch.mjs";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const [url, token, shots] = process.argv.slice(2);
if (!shots) {
  console.error("usage: node dlq.mjs URL TOKEN SCREENSHOT_DIR");
  process.exit(2);
}
mkdirSync(shots, { recursive: true });
await drive(shots, async (page, result) => {
  await page.goto(url);
  // The instance has a token: reads need it, entered at the top.
  await page.fill("#token", token);
  await page.click("#token-use");
  // The tab is reached from the review queue, as a person would.
  await page.click("#tab-dlq");
  await page.locator("#dlq-body tr").first().waitFor({ timeout: 20000 });
  await page.locator("#ob-body tr").first().waitFor({ timeout: 20000 });
  result.dlq_rows = await page.locator("#dlq-body tr").count();
  result.outbox_rows = await page.locator("#ob-body tr").count();
  result.dlq_counts = await page.locator("#dlq-counts").innerText();
  result.outbox_counts = await page.locator("#ob-counts").innerText();
  result.badge = await page.locator("#dlq-badge").innerText();
  result.dlq_first = (await page.locator("#dlq-body tr").first().innerText()).replace(/\s+/g, " ").trim();
  result.outbox_first = (await page.locator("#ob-body tr").first().innerText()).replace(/\s+/g, " ").trim();
  await page.screenshot({ path: join(shots, "1-dead-letters.png"), fullPage: true });

  const dlqRow = page.locator("#dlq-body tr").first();
  result.position = await dlqRow.getAttribute("data-position");
  await dlqRow.locator("input[type=checkbox]").check();
  const obRow = page.locator("#ob-body tr").first();
  result.outbox_id = Number(await obRow.getAttribute("data-id"));
  await obRow.locator("input[type=checkbox]").check();
  result.selected = await page.locator("#rd-selected").innerText();
  await page.fill("#rd-actor", "browser-test");
  await page.fill("#rd-note", "Producer fixed; re-driven from the browser test.");
  await page.fill("#rd-token", token);

  await page.click("#rd-dry");
  const dry = page.locator("#redrive-dry");
  await dry.waitFor({ timeout: 15000 });
  result.dry_run = await dry.innerText();
  result.still_selected = await page.locator("#rd-selected").innerText();

  await page.click("#rd-submit");
  const done = page.locator("#redrive-done");
  await done.waitFor({ timeout: 30000 });
  result.redriven = await done.innerText();
  await page.locator("#audit-body tr").nth(1).waitFor({ timeout: 15000 });
  result.audit = (await page.locator("#audit-body tr").allInnerTexts()).map((t) => t.replace(/\s+/g, " ").trim());
  result.dlq_positions_after = await page.locator("#dlq-body tr").evaluateAll((rows) => rows.map((r) => r.dataset.position));
  result.outbox_rows_after = await page.locator("#ob-body tr").count();
  await page.screenshot({ path: join(shots, "2-redriven.png"), fullPage: true });
});
