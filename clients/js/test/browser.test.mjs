// The scenarios of test/scenarios.mjs in headless Chromium, one page each,
// in Node's test runner. The page is opened on the origin of a proxy in
// front of the server and imports the client the way users do, from the
// server's own `/tidings.js`; the scenarios module is handed to the page by
// the browser driver. Publishing, /health/deep and the proxy's controls run
// here in Node. Needs the servers node.test.mjs needs.
import { test, after } from "node:test";
import { readFile } from "node:fs/promises";
import { chromium } from "playwright-core";
import * as lib from "../dist/tidings.js";
import { scenarios } from "./scenarios.mjs";
import { proxy } from "./proxy.mjs";
import { mint } from "./auth.mjs";

const servers = { main: process.env.TIDINGS_URL, slow: process.env.TIDINGS_SLOW_URL, other: process.env.TIDINGS_OTHER_URL, auth: process.env.TIDINGS_AUTH_URL };
const secret = process.env.TIDINGS_AUTH_SECRET;
if (!servers.main || !servers.slow || !servers.other || !servers.auth || !secret) {
  throw new Error("set TIDINGS_URL, TIDINGS_SLOW_URL, TIDINGS_OTHER_URL, TIDINGS_AUTH_URL and TIDINGS_AUTH_SECRET, or run `scripts/test -- js_client` from the repository root, which starts the servers");
}
const proxies = { main: await proxy(servers.main), slow: await proxy(servers.slow), auth: await proxy(servers.auth) };
const source = await readFile(new URL("./scenarios.mjs", import.meta.url), "utf8");
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
after(async () => {
  await browser.close();
  await Promise.all(Object.values(proxies).map((p) => p.close()));
});

for (const s of scenarios.filter((s) => !s.node)) {
  test(`chromium: ${s.name}`, { timeout: 60_000 }, async () => {
    const p = proxies[s.server];
    const url = servers[s.server];
    const page = await browser.newPage();
    const logs = [];
    page.on("console", (m) => logs.push(`${m.type()}: ${m.text()}`));
    page.on("pageerror", (e) => logs.push(`pageerror: ${e.message}`));
    try {
      await page.route("**/__test/scenarios.mjs", (route) => route.fulfill({ contentType: "text/javascript", body: source }));
      // The server with tokens on takes the runner's publishes with a token.
      const token = s.server === "auth" ? () => mint(secret, 60) : undefined;
      await page.exposeFunction("__publish", (event) => lib.publish(event, { url, token }));
      await page.exposeFunction("__mint", (ttlSeconds) => mint(secret, ttlSeconds));
      await page.exposeFunction("__deep", async () => (await fetch(new URL("/health/deep", url))).json());
      await page.exposeFunction("__drop", () => p.drop());
      await page.exposeFunction("__requests", (prefix) => p.requests(prefix));
      await page.exposeFunction("__swap", (toOther) => p.retarget(toOther ? servers.other : url));
      await page.exposeFunction("__otherPublish", (event) => lib.publish(event, { url: servers.other }));
      await page.exposeFunction("__otherDeep", async () => (await fetch(new URL("/health/deep", servers.other))).json());
      await page.exposeFunction("__stall", () => p.stall());
      await page.exposeFunction("__unstall", () => p.unstall());
      await page.goto(`${p.url}/health`);
      const outcome = await page.evaluate(async (name) => {
        const lib = await import("/tidings.js");
        const { scenarios } = await import("/__test/scenarios.mjs");
        const env = {
          url: location.origin,
          publish: (event) => window.__publish(event),
          deep: () => window.__deep(),
          drop: () => window.__drop(),
          swap: (toOther) => window.__swap(toOther),
          other: { publish: (event) => window.__otherPublish(event), deep: () => window.__otherDeep() },
          stall: () => window.__stall(),
          unstall: () => window.__unstall(),
          mint: (ttlSeconds) => window.__mint(ttlSeconds),
          // Counted in Node: a promise here, awaited by the scenarios.
          requests: (prefix) => window.__requests(prefix),
          runtime: "chromium",
        };
        try {
          await scenarios.find((s) => s.name === name).run(lib, env);
          return null;
        } catch (e) {
          return String(e && e.stack ? e.stack : e);
        }
      }, s.name);
      if (outcome) throw new Error(`${outcome}\n${logs.join("\n")}`);
    } finally {
      await page.close();
    }
  });
}
