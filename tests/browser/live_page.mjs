// Drives the live page in headless Chromium for tests/api/browser.rs.
// Protocol on stdio: prints "RESTART" when the server should be restarted,
// then expects "RESTARTED <id>" (the id of an event published right after
// the restart); prints "OK <json>" when every check passed. A third
// argument "ws" runs the same checks with the page on its WebSocket
// transport. The base may be https:// (a test certificate, which the
// browser is told to accept and Node trusts through NODE_EXTRA_CA_CERTS).
import { chromium } from "playwright-core";
import readline from "node:readline";

const base = process.argv[2];
const transport = process.argv[3] === "ws" ? "ws" : "sse";
const shot = process.env.TIDINGS_SCREENSHOT;
const lines = readline.createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => lines.once("line", resolve));

async function publish(payload) {
  const r = await fetch(`${base}/v1/events`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ event_type: "comment.posted", payload }),
  });
  if (r.status !== 201) throw new Error(`publish answered ${r.status}`);
  return (await r.json()).event_ids[0];
}

const shown = (page) => page.$$eval("#events li", (items) => items.map((li) => Number(li.dataset.id)).filter(Boolean).reverse());
const waitFor = (page, id) => page.waitForSelector(`#events li[data-id="${id}"]`, { timeout: 15000 });
const waitOpen = (page) => page.waitForFunction(() => document.getElementById("state").textContent === "open", null, { timeout: 15000 });

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--ignore-certificate-errors"],
});
try {
  const page = await browser.newPage();
  const filter = encodeURIComponent(JSON.stringify({ types: ["comment.*"] }));
  await page.goto(`${base}/?filter=${filter}${transport === "ws" ? "&transport=ws" : ""}`);
  await waitOpen(page);
  if (base.startsWith("https:")) {
    const protocol = await page.evaluate(() => performance.getEntriesByType("navigation")[0].nextHopProtocol);
    if (protocol !== "h2") throw new Error(`over HTTPS the page came over ${protocol}, expected h2`);
  }
  // The page follows on the transport asked for, and only on it.
  const metrics = await (await fetch(`${base}/metrics`)).text();
  for (const t of ["sse", "ws"]) {
    const want = `tidings_clients_connected{transport="${t}"} ${t === transport ? 1 : 0}`;
    if (!metrics.includes(want)) throw new Error(`expected ${want} in /metrics`);
  }

  const a = await publish({ step: "a" });
  await waitFor(page, a);

  // The server restarts; the page reconnects by itself with Last-Event-ID.
  console.log("RESTART");
  const [word, bText] = (await nextLine()).split(" ");
  if (word !== "RESTARTED") throw new Error(`unexpected ${word}`);
  const b = Number(bText);
  await waitFor(page, b);
  const c = await publish({ step: "c" });
  await waitFor(page, c);
  const afterRestart = await shown(page);
  if (JSON.stringify(afterRestart) !== JSON.stringify([a, b, c])) {
    throw new Error(`after the restart the page shows ${afterRestart}, expected ${[a, b, c]}`);
  }

  // Every reload resumes from the last id the page kept: nothing repeated,
  // however many times, and nothing missed while the page was away.
  const afterReload = [];
  for (const step of ["d", "e"]) {
    await page.reload();
    await waitOpen(page);
    const id = await publish({ step });
    await waitFor(page, id);
    const now = await shown(page);
    if (JSON.stringify(now) !== JSON.stringify([id])) {
      throw new Error(`after reload ${afterReload.length + 1} the page shows ${now}, expected ${[id]}`);
    }
    afterReload.push(now);
  }
  // The page stops listening, an event is published, then the page comes back.
  await page.evaluate(() => source.close());
  const f = await publish({ step: "f" });
  await page.reload();
  await waitOpen(page);
  const g = await publish({ step: "g" });
  await waitFor(page, g);
  const third = await shown(page);
  if (JSON.stringify(third) !== JSON.stringify([f, g])) {
    throw new Error(`after reload 3 the page shows ${third}, expected ${[f, g]}`);
  }
  afterReload.push(third);
  if (shot) await page.screenshot({ path: shot, fullPage: true });
  console.log(`OK ${JSON.stringify({ afterRestart, afterReload })}`);
} finally {
  await browser.close();
  lines.close();
}
