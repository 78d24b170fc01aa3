// Opens the exception panel that `reconciler demo` leaves running, as a
// newcomer would after the summary: the review queue has cases, and each
// given operation opens with its outcome. Run by tests/integration/demo.rs;
// prints one JSON line.
//
// usage: node demo.mjs URL OPERATION_ID=OUTCOME... SCREENSHOT_DIR
import { drive } from "./launch.mjs";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const args = process.argv.slice(2);
const [url, shots] = [args[0], args[args.length - 1]];
const cases = args.slice(1, -1).map((a) => a.split("="));
if (!shots || cases.length === 0) {
  console.error("usage: node demo.mjs URL OPERATION_ID=OUTCOME... SCREENSHOT_DIR");
  process.exit(2);
}
mkdirSync(shots, { recursive: true });
await drive(shots, async (page, result) => {
  await page.goto(url);
  await page.locator("#queue-body tr").first().waitFor({ timeout: 20000 });
  result.queue_rows = await page.locator("#queue-body tr").count();
  await page.screenshot({ path: join(shots, "queue.png"), fullPage: true });
  result.outcomes = {};
  for (const [id, outcome] of cases) {
    await page.goto(`${url}?op=${encodeURIComponent(id)}`);
    await page.locator("#d-id", { hasText: id }).waitFor({ timeout: 10000 });
    const badge = page.locator(`#d-facts .outcome-${outcome}`);
    await badge.waitFor({ timeout: 10000 });
    result.outcomes[outcome] = { operation_id: id, shown: await badge.innerText(), reason: await page.locator("#d-reason").innerText() };
    await page.screenshot({ path: join(shots, `${outcome}.png`), fullPage: true });
  }
});
