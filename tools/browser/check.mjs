// Drives the chat page of a running `moeflux serve` in headless Chromium:
// sends a message and waits for the answer and its statistics line, then
// sends a long one and stops it mid-answer, and saves a screenshot.
//   node tools/browser/check.mjs URL SCREENSHOT.png
// Run through tools/chat_page_check.sh, which starts the server.
import { chromium } from "playwright-core";

const [url, shot] = process.argv.slice(2);
if (!url || !shot) {
  console.error("usage: node check.mjs URL SCREENSHOT.png");
  process.exit(2);
}
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
let failed = false;
const check = (ok, what) => {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failed = true;
};
try {
  const page = await browser.newPage({ viewport: { width: 1000, height: 760 } });
  await page.goto(url);
  check((await page.textContent("#model")) !== "moeflux", "the page names the served model");

  // 1. A whole answer, with its statistics line.
  await page.fill("#temperature", "0.7");
  await page.fill("#input", "Who made the heaven and the earth?");
  await page.click("#send");
  const foot = page.locator(".msg.assistant .stats").first();
  await foot.filter({ hasText: /tok\/s/ }).waitFor({ timeout: 60000 });
  const answer = (await page.locator(".msg.assistant").first().innerText()).trim();
  check(answer.length > 10, `first answer: ${JSON.stringify(answer.slice(0, 120))}`);
  check(/tok\/s/.test(await foot.innerText()), `statistics: ${(await foot.innerText()).trim()}`);

  // 2. A long answer, stopped as soon as text arrives.
  await page.fill("#max_tokens", "1000");
  await page.fill("#input", "Tell me of the kings of Israel and Judah.");
  await page.click("#send");
  const second = page.locator(".msg.assistant").nth(1);
  await second.filter({ hasText: /\w/ }).waitFor({ timeout: 60000 });
  check(await page.isEnabled("#stop"), "Stop is enabled while the answer streams");
  await page.click("#stop");
  await page.waitForFunction(() => document.querySelector("#stop").disabled, null, { timeout: 10000 });
  const stopped = (await second.innerText()).trim();
  const words = stopped.split(/\s+/).length;
  check(words < 900, `stopped answer has ${words} words: ${JSON.stringify(stopped.slice(0, 80))}…`);
  check(await page.isEnabled("#send"), "Send is enabled again after Stop");

  await page.screenshot({ path: shot, fullPage: true });
  console.log(`screenshot: ${shot}`);
} catch (e) {
  console.log(`FAIL ${e.message}`);
  failed = true;
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
