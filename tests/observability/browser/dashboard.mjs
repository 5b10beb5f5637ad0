// Opens inferlb's /dashboard in headless Chromium (Debian's, through playwright-core), waits until
// the page says it has drawn everything, takes a full-page screenshot and prints one JSON line:
// the HTTP status, console errors / page errors / failed requests, requests to other origins,
// and what each chart drew (series, points, inked pixels of each canvas), and what the autoscaling
// panel showed (its charts are .chart elements too; its events table rows; or its "off" text), and
// what the versions and rollouts panel showed (each model's weights bar, its rollouts table rows;
// or its "no versions" text).
// With ADMIN_KEY given, a page that asks for the key (auth on) is signed in through its form and
// the key it then sends is reported (askedForKey, keyStored).
// usage: node dashboard.mjs URL SCREENSHOT.png [timeout_ms] [ADMIN_KEY]
import { chromium } from "playwright-core";

const [url, shot, timeoutArg, adminKey] = process.argv.slice(2);
const timeout = Number(timeoutArg || 30000);
const origin = new URL(url).origin;
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
  timeout,
});
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  const consoleErrors = [];
  const warnings = [];
  const external = [];
  page.on("console", (m) => {
    if (m.type() === "error") consoleErrors.push(m.text());
    else if (m.type() === "warning") warnings.push(m.text());
  });
  page.on("pageerror", (e) => consoleErrors.push(`pageerror: ${e.message}`));
  page.on("requestfailed", (r) => consoleErrors.push(`requestfailed: ${r.url()} ${r.failure()?.errorText}`));
  page.on("request", (r) => {
    if (!r.url().startsWith(origin) && !r.url().startsWith("data:")) external.push(r.url());
  });
  const resp = await page.goto(url, { waitUntil: "load", timeout });
  await page.waitForFunction(() => window.inferlbDashboard && window.inferlbDashboard.ready === true, null,
                             { timeout });
  const askedForKey = await page.evaluate(() => window.inferlbDashboard.needsKey && !document.getElementById("login").hidden);
  const bearer = [];
  if (adminKey && askedForKey) {
    page.on("request", (r) => {
      const u = r.url();
      if (u.includes("/reports/") || u.includes("/dashboard/node-states") || u.includes("/dashboard/autoscale") ||
          u.includes("/dashboard/versions") || u.includes("/dashboard/lora")) {
        bearer.push(r.headers().authorization || "");
      }
    });
    await page.fill("#login input[name=key]", adminKey);
    await page.click("#login button[type=submit]");
    await page.waitForFunction(() => window.inferlbDashboard.ready === true && !window.inferlbDashboard.needsKey,
                               null, { timeout });
  }
  // The autoscaling panel draws after the data calls: its charts, or the sentence saying it is off.
  if (!(await page.evaluate(() => window.inferlbDashboard.needsKey))) {
    await page.waitForSelector("#autoscale canvas, #autoscale-off", { timeout });
    await page.waitForSelector("#versions .vr-row, #versions-off", { timeout });
    await page.waitForSelector("#lora table, #lora-off", { timeout });
  }
  const keyStored = await page.evaluate(() => sessionStorage.getItem("inferlb.adminKey") !== null);
  const drawn = await page.evaluate(() => {
    const inked = [...document.querySelectorAll(".chart")].map((el) => {
      const c = el.querySelector("canvas");
      if (!c) return [el.id, 0];
      const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
      let n = 0;
      for (let i = 3; i < data.length; i += 4) if (data[i] > 0) n++;
      return [el.id, n];
    });
    return {
      charts: window.inferlbDashboard.charts,
      pageErrors: window.inferlbDashboard.errors,
      inked: Object.fromEntries(inked),
      stateSegments: document.querySelectorAll(".state-seg").length,
      tiles: [...document.querySelectorAll(".tile")].map((t) => t.innerText.replace(/\s+/g, " ")),
      tables: document.querySelectorAll("table tbody tr").length,
      autoscale: window.inferlbDashboard.autoscale || null,
      autoscaleOff: document.getElementById("autoscale-off")?.innerText ?? null,
      autoscaleStatus: document.getElementById("autoscale-status")?.innerText ?? null,
      scalingRows: [...document.querySelectorAll("#table-scaling tbody tr")].map((tr) => tr.innerText.replace(/\s+/g, " ")),
      versions: window.inferlbDashboard.versions || null,
      versionsOff: document.getElementById("versions-off")?.innerText ?? null,
      versionBars: [...document.querySelectorAll("#versions .vr-row")].map((row) => ({
        model: row.querySelector(".name").innerText,
        width: row.querySelector(".vr-bar").getBoundingClientRect().width,
        title: row.querySelector(".vr-bar").title,
        segments: [...row.querySelectorAll(".vr-seg")].map((s) => ({
          text: s.innerText, width: s.getBoundingClientRect().width, color: getComputedStyle(s).backgroundColor })),
      })),
      rolloutRows: [...document.querySelectorAll("#table-rollouts tbody tr")].map((tr) => tr.innerText.replace(/\s+/g, " ")),
    };
  });
  await page.screenshot({ path: shot, fullPage: true });
  console.log(JSON.stringify({ status: resp.status(), consoleErrors, warnings, external, askedForKey, keyStored,
                                bearer, ...drawn }));
} finally {
  await browser.close();
}
