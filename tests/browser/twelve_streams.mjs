// Twelve EventSources on one origin, in headless Chromium, for
// tests/api/browser.rs: over HTTPS (HTTP/2) every one of them opens and
// receives an event the page itself publishes; over plain HTTP/1.1 the
// browser opens six (its limit per origin) and the page's own publish never
// leaves it. Usage: node twelve_streams.mjs <https base> <http base>.
// Prints "OK <json>" with what it saw.
import { chromium } from "playwright-core";

const [tlsBase, plainBase] = process.argv.slice(2);

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--ignore-certificate-errors"],
});

// Opens twelve streams on the page's origin, waits until `expectOpen` are
// open, publishes from the page (bounded by `publishMs`), and waits until
// every open stream has the event (or `deliverMs` passed).
async function run(base, expectOpen, publishMs, deliverMs) {
  const page = await browser.newPage();
  await page.goto(`${base}/health`);
  return page.evaluate(async ({ expectOpen, publishMs, deliverMs }) => {
    const streams = [];
    const received = new Array(12).fill(0);
    let opened = 0;
    const allOpen = new Promise((resolve) => {
      for (let i = 0; i < 12; i++) {
        const es = new EventSource("/v1/stream?types=comment.posted");
        es.onopen = () => { opened += 1; if (opened === expectOpen) resolve(); };
        es.onmessage = () => { received[i] += 1; };
        streams.push(es);
      }
    });
    await allOpen;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), publishMs);
    let published = false;
    try {
      const r = await fetch("/v1/events", {
        method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ event_type: "comment.posted", payload: { from: "page" } }), signal: abort.signal,
      });
      published = r.status === 201;
    } catch (e) {
      published = false;
    }
    clearTimeout(timer);
    const deadline = Date.now() + deliverMs;
    while (published && received.filter((n) => n > 0).length < opened && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
    }
    const result = { opened, published, receivedBy: received.filter((n) => n > 0).length };
    streams.forEach((es) => es.close());
    return result;
  }, { expectOpen, publishMs, deliverMs });
}

try {
  const tls = await run(tlsBase, 12, 10000, 10000);
  const plain = await run(plainBase, 6, 3000, 0);
  console.log("OK " + JSON.stringify({ tls, plain }));
} finally {
  await browser.close();
}
