// Drives Debian's chromium through playwright-core against a running Souq broker:
//   node dashboard_check.mjs --api http://127.0.0.1:PORT --region mad --app web --out DIR
//        [--chromium PATH] [--expect-mode events|polling] [--jobs]
// Opens /ui, creates a machine through the API and waits for its row, stops it and waits for
// the row to say `stopped`, then clicks it and waits for the placement winner; with --jobs,
// submits a batch job and waits for its row, cancels it and waits for `cancelled`; all on one
// page load. Prints one JSON line with what it saw; exits non-zero (with a screenshot in --out) on
// any failure. Every wait is a Playwright wait with a deadline.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";

import { chromium } from "playwright-core";

const { values: opt } = parseArgs({
  options: {
    api: { type: "string" },
    region: { type: "string", default: "mad" },
    app: { type: "string", default: "web" },
    out: { type: "string", default: tmpdir() },
    chromium: { type: "string", default: "/usr/bin/chromium" },
    "expect-mode": { type: "string" }, // "events" or "polling": fail if the page chose otherwise
    token: { type: "string" }, // the API token: sent by this script, given to the page as #token=
    jobs: { type: "boolean", default: false }, // the broker serves /sched: check the Jobs table
  },
});
if (!opt.api) throw new Error("--api URL is required");

const WAIT_MS = 15_000;
const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

async function api(method, path, body) {
  const response = await fetch(opt.api + path, {
    method,
    headers: {
      ...(body ? { "content-type": "application/json" } : {}),
      ...(opt.token ? { authorization: `Bearer ${opt.token}` } : {}),
    },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return JSON.parse(text);
}

const profile = mkdtempSync(join(tmpdir(), "souq-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: opt.chromium,
  headless: true,
  args: FLAGS,
});
const page = context.pages()[0] ?? (await context.newPage());
const consoleErrors = [];
page.on("pageerror", (err) => consoleErrors.push(String(err)));
const seen = { steps: [] };
const step = (name) => seen.steps.push({ name, ms: Math.round(performance.now()) });
let failed = null;

try {
  await page.goto(`${opt.api}/ui` + (opt.token ? `#token=${encodeURIComponent(opt.token)}` : ""));
  await page.evaluate(() => {
    window.__souqLoaded = true; // gone if the page ever reloads
  });
  await page.locator("#workers tr[data-worker-id]").first().waitFor({ timeout: WAIT_MS });
  await page.locator(`#regions tr[data-region="${opt.region}"]`).waitFor({ timeout: WAIT_MS });
  step("workers and regions shown");
  seen.spotPrice = await page.locator(`#regions tr[data-region="${opt.region}"] td.spot-price`).innerText();

  // Without GET /v1/apps the page learns apps from the user; with it, typing is harmless.
  await page.fill("#app-input", opt.app);
  await page.press("#app-input", "Enter");

  const made = await api("POST", `/v1/apps/${opt.app}/machines`, {
    region: opt.region,
    config: { cmd: ["sleep", "600"], guest: { cpus: 1, memory_mb: 128 } },
  });
  seen.machine = made.id;
  const row = page.locator(`#machines tr[data-machine-id="${made.id}"]`);
  await row.waitFor({ timeout: WAIT_MS });
  await page.locator(`#machines tr[data-machine-id="${made.id}"][data-state="started"]`).waitFor({ timeout: WAIT_MS });
  step("machine appeared, started");

  await api("POST", `/v1/apps/${opt.app}/machines/${made.id}/stop`, {});
  await page.locator(`#machines tr[data-machine-id="${made.id}"][data-state="stopped"]`).waitFor({ timeout: WAIT_MS });
  seen.stateText = (await row.locator(".machine-state").innerText()).trim();
  step("machine shown stopped");

  await row.click();
  const winner = page.locator("#placement-winner");
  await page.waitForFunction(
    (expected) => document.getElementById("placement-winner")?.textContent === expected,
    made.placement.winner,
    { timeout: WAIT_MS },
  );
  seen.winner = await winner.innerText();
  seen.winnerRow = await page.locator("#placement-offers tr.winner td.id").innerText();
  step("placement winner shown");

  await page.locator(`#feed li[data-machine-id="${made.id}"]`).first().waitFor({ timeout: WAIT_MS });
  // When each of the machine's lines says it happened (its <time datetime>).
  seen.feedTimes = await page
    .locator(`#feed li[data-machine-id="${made.id}"] time`)
    .evaluateAll((nodes) => nodes.map((n) => n.getAttribute("datetime")));
  seen.mode = await page.locator("#mode").getAttribute("data-mode");
  if (opt["expect-mode"] && seen.mode !== opt["expect-mode"]) {
    throw new Error(`the page is in ${seen.mode} mode, not ${opt["expect-mode"]}`);
  }
  if (opt.jobs) {
    // More cpus than any test worker has: no agent takes it, it waits until cancelled.
    const name = `ui-job-${Date.now()}`;
    await api("POST", "/sched/submit", { name, command: "sleep 600", cpus: 64 });
    await page.locator(`#jobs tr[data-job="${name}"][data-state="pending"]`).waitFor({ timeout: WAIT_MS });
    step("job shown pending");
    await api("POST", `/sched/cancel/${name}`);
    const row = page.locator(`#jobs tr[data-job="${name}"][data-state="cancelled"]`);
    await row.waitFor({ timeout: WAIT_MS });
    seen.jobState = (await row.locator(".job-state").innerText()).trim();
    step("job shown cancelled");
  } else {
    seen.jobsHidden = await page.locator("#jobs-section").isHidden();
  }
  seen.notReloaded = await page.evaluate(() => window.__souqLoaded === true);
  seen.pageErrors = consoleErrors;
  await page.screenshot({ path: join(opt.out, "dashboard.png"), fullPage: true });
} catch (err) {
  failed = err;
  await page.screenshot({ path: join(opt.out, "failure.png"), fullPage: true }).catch(() => {});
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}

if (failed) {
  console.error(`dashboard check failed after ${JSON.stringify(seen.steps)}: ${failed.stack || failed}`);
  console.error(`page errors: ${JSON.stringify(consoleErrors)}`);
  process.exit(1);
}
console.log(JSON.stringify(seen));
