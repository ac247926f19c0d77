// Drives the operator console in headless Chromium for tests/api/browser.rs,
// with tokens on. Usage: node --experimental-websocket console.mjs <base>
// <admin token> <reader token> <store>. As the admin it publishes, connects
// clients of both transports, creates a durable consumer and writes an
// entity, then reads every one of them back from the page; publishes from
// the page's form; pauses and resumes the live list. As a reader (no admin
// claim) it checks the console is read-only. Prints "OK <json>" when every
// check passed; TIDINGS_SCREENSHOT=<file> also saves a screenshot.
import { chromium } from "playwright-core";
import * as tidings from "../../clients/js/dist/tidings.js";

const [base, admin, reader, store] = process.argv.slice(2);
const shot = process.env.TIDINGS_SCREENSHOT;
const T = { timeout: 15000 };

async function api(path, token, init = {}) {
  const r = await fetch(`${base}${path}`, { ...init, headers: { authorization: `Bearer ${token}`, "content-type": "application/json", ...(init.headers || {}) } });
  const body = r.status === 204 ? null : await r.json();
  if (!r.ok) throw new Error(`${path} answered ${r.status} ${JSON.stringify(body)}`);
  return body;
}
const publish = async (token, payload) => (await api("/v1/events", token, { method: "POST", body: JSON.stringify({ event_type: "comment.posted", payload }) })).event_ids[0];
const textOf = (page, id) => page.$eval(`#${id}`, (e) => e.textContent);
const waitText = (page, id, want) =>
  page.waitForFunction(([id, want]) => document.getElementById(id)?.textContent === want, [id, want], T).catch(async () => {
    throw new Error(`#${id} shows ${JSON.stringify(await textOf(page, id))}, expected ${JSON.stringify(want)}`);
  });
const shown = (page) => page.$$eval("#events li", (items) => items.map((li) => Number(li.dataset.id)).filter(Boolean).reverse());
const waitFor = (page, id) => page.waitForSelector(`#events li[data-id="${id}"]`, T);
const check = (ok, what) => {
  if (!ok) throw new Error(what);
};

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const extra = [];
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.goto(`${base}/?access_token=${admin}&refresh=500&filter=${encodeURIComponent(JSON.stringify({ types: ["comment.*"] }))}`);
  await waitText(page, "who", "ops · admin");
  await waitText(page, "state", "open");
  check(!(await page.isHidden("#tab-publish")), "an admin has the publish tab");

  // What the server published by itself at start-up (the seeded peer's entity).
  const metrics = await (await fetch(`${base}/metrics`)).text();
  const before = metrics.split("\n").filter((l) => l.startsWith("tidings_events_published_total")).reduce((n, l) => n + Number(l.split(" ").pop()), 0);
  // A durable consumer (at the head), three events, two more streams and a device.
  await api("/v1/poll", admin, { method: "POST", body: JSON.stringify({ consumer_id: "console-test", filter: { types: ["comment.*"] } }) });
  const ids = [];
  for (const step of ["a", "b", "c"]) ids.push(await publish(admin, { step, nested: { list: [1, 2], ok: true } }));
  for (let i = 0; i < 2; i++) {
    const s = tidings.stream({ types: ["comment.*"] }, { url: base, token: admin, onEvent: () => {} });
    extra.push(s);
  }
  const { key } = await tidings.createDeviceKey();
  const device = tidings.connect({ url: base, token: admin, deviceId: "console-device", key, onEvent: () => {} });
  extra.push(device);
  await device.ready();

  // The cards read them back.
  await waitText(page, "stat-store", store);
  await waitText(page, "stat-database", "up");
  await waitText(page, "stat-head", String(ids[2]));
  await waitText(page, "stat-published-total", String(before + 3));
  await waitText(page, "stat-clients-sse", "3");
  await waitText(page, "stat-clients-ws", "1");
  await page.waitForFunction(() => Number(document.getElementById("chart").dataset.max) > 0, null, T);
  const chartPoints = await page.$eval("#chart .published", (p) => p.getAttribute("points").trim().split(" ").length);
  check(chartPoints >= 1, "the chart has points");
  for (const id of ids) await waitFor(page, id);
  // Payloads are pretty-printed and collapsible.
  const payload = await page.$eval(`#events li[data-id="${ids[0]}"] details.payload`, (d) => ({ open: d.open, text: d.querySelector("pre").textContent }));
  check(payload.open && tidings.canonicalJson(JSON.parse(payload.text)) === tidings.canonicalJson({ step: "a", nested: { list: [1, 2], ok: true } }), `payload ${JSON.stringify(payload)}`);

  // Who has an event (GET /v1/events/{id}): the consumer acknowledges the
  // first, not the second.
  await api("/v1/consumers/console-test/ack", admin, { method: "POST", body: JSON.stringify({ cursor: ids[0] }) });
  const delivered = async (id) => {
    const at = `#events li[data-id="${id}"] details.deliveries`;
    await page.click(`${at} summary`);
    await page.waitForSelector(`${at} tr.consumer[data-id="console-test"]`, T);
    return page.$eval(`${at} tr.consumer[data-id="console-test"] td.state`, (td) => td.textContent);
  };
  check((await delivered(ids[0])) === "acknowledged", "the first event is acknowledged by the consumer");
  check((await delivered(ids[1])) === "pending", "the second is pending");

  // Consumers: the one created, two behind (it acknowledged the first).
  await page.click("#tab-consumers");
  const row = '#consumers-rows tr.consumer[data-id="console-test"]';
  await page.waitForSelector(row, T);
  await page.waitForFunction((row) => document.querySelector(row + " .lag")?.textContent === "2", row, T);
  check(await page.$(`${row} button.delete`), "an admin may delete a consumer");

  // The tree: an entity written through the API, with a secret-named field hidden.
  await api("/v1/tree/notes/a", admin, { method: "PUT", body: JSON.stringify({ type: "note", data: { text: "hello from the tree", api_token: "s3cr3t-value" } }) });
  await page.click("#tab-tree");
  await page.fill('#tree-form input[name="path"]', "notes/");
  await page.click("#tree-form button");
  await page.click('#tree-list a[data-path="notes/a"]');
  await page.waitForFunction(() => document.getElementById("tree-entity").textContent.includes("hello from the tree"), null, T);
  const entity = await textOf(page, "tree-entity");
  check(!entity.includes("s3cr3t-value") && entity.includes("(hidden)"), `secret shown: ${entity}`);

  // Subscriptions and peers: the peer the server was started with.
  await page.click("#tab-subscriptions");
  const peer = `sha256:${"ab".repeat(32)}`;
  await page.waitForFunction((peer) => document.getElementById("peers-rows").textContent.includes(peer), peer, T);
  const peerRow = await page.$eval("#peers-rows tr", (tr) => [...tr.children].map((td) => td.textContent));
  check(peerRow[0] === peer && peerRow[1] === "http://127.0.0.1:9", `peer row ${peerRow}`);
  await page.waitForFunction(() => document.getElementById("mirrors-rows").textContent.includes("No mirrors"), null, T);
  await page.waitForFunction(() => /subscription/.test(document.getElementById("subscriptions-note").textContent), null, T);

  // The publish form.
  await page.click("#tab-publish");
  await page.fill('#publish-form input[name="event_type"]', "comment.posted");
  await page.fill('#publish-form textarea[name="payload"]', '{"from": "the console"}');
  await page.click('#publish-form button[type="submit"]');
  await page.waitForFunction(() => /^published as #\d+$/.test(document.getElementById("publish-result").textContent), null, T);
  const fromForm = Number((await textOf(page, "publish-result")).split("#")[1]);
  await page.click("#tab-live");
  await waitFor(page, fromForm);
  const refused = await (async () => {
    await page.click("#tab-publish");
    await page.fill('#publish-form input[name="event_type"]', "Not A Name");
    await page.click('#publish-form button[type="submit"]');
    await page.waitForFunction(() => document.getElementById("publish-result").className === "error", null, T);
    return textOf(page, "publish-result");
  })();
  check(refused.startsWith("invalid_event_name"), `refusal shown: ${refused}`);
  await page.click("#tab-live");

  // Pause, an event meanwhile, resume: it arrives, nothing repeated.
  await page.click("#pause");
  await waitText(page, "state", "paused");
  const meanwhile = await publish(admin, { step: "while paused" });
  await waitText(page, "stat-head", String(meanwhile));
  check(!(await page.$(`#events li[data-id="${meanwhile}"]`)), "nothing shown while paused");
  await page.click("#pause");
  await waitFor(page, meanwhile);
  const all = await shown(page);
  check(JSON.stringify(all) === JSON.stringify([...ids, fromForm, meanwhile]), `the list shows ${all}`);
  check(!(await page.evaluate(() => document.body.innerText)).includes(admin), "the token is never shown");
  if (shot) {
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: shot });
  }

  // The token left the address (it lives in the tab's sessionStorage).
  check(!page.url().includes(admin) && !page.url().includes("access_token"), `the address keeps the token: ${page.url()}`);
  // Paused before anything matched: what comes meanwhile still arrives on resume.
  const quiet = await browser.newPage();
  await quiet.goto(`${base}/?access_token=${admin}&filter=${encodeURIComponent(JSON.stringify({ types: ["comment.*"], payload: { "==": [{ var: "step" }, "quiet"] } }))}`);
  await waitText(quiet, "state", "open");
  await quiet.click("#pause");
  await waitText(quiet, "state", "paused");
  const whilePaused = await publish(admin, { step: "quiet" });
  await quiet.click("#pause");
  await waitFor(quiet, whilePaused);
  check(JSON.stringify(await shown(quiet)) === JSON.stringify([whilePaused]), "the quiet page shows the one event");
  await quiet.close();

  // A reader: the same console, read-only.
  const ro = await browser.newPage();
  await ro.goto(`${base}/?access_token=${reader}&refresh=500&filter=${encodeURIComponent(JSON.stringify({ types: ["comment.*"] }))}&since=0`);
  await waitText(ro, "who", "viewer · read-only");
  await waitText(ro, "state", "open");
  check(await ro.isHidden("#tab-publish"), "no publish tab for a reader");
  for (const id of [...ids, fromForm, meanwhile]) await waitFor(ro, id);
  await ro.click("#tab-consumers");
  await ro.waitForFunction(() => /^0 consumers/.test(document.getElementById("consumers-note").textContent), null, T);
  check((await ro.$$("button.delete")).length === 0, "no delete for a reader");
  await ro.click("#tab-subscriptions");
  await ro.waitForFunction(() => document.getElementById("subscriptions-note").textContent.includes("only admins"), null, T);
  await ro.click("#tab-tree");
  await ro.fill('#tree-form input[name="path"]', "system/");
  await ro.click("#tree-form button");
  await ro.waitForFunction(() => document.getElementById("tree-note").textContent === "forbidden_tree_access", null, T);
  console.log(`OK ${JSON.stringify({ ids, fromForm, meanwhile, chartPoints })}`);
} finally {
  for (const e of extra) e.close();
  await browser.close();
}
