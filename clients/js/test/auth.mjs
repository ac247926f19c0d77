// Tokens for the scenarios that run against the server with tokens on
// (TIDINGS_AUTH_URL, HS256 with TIDINGS_AUTH_SECRET): minted in Node, as an
// identity provider would.
import { createHmac } from "node:crypto";

/** An HS256 JWT for `sub` that expires `ttlSeconds` from now, granting everything. */
export function mint(secret, ttlSeconds, claims = {}) {
  const part = (value) => Buffer.from(JSON.stringify(value)).toString("base64url");
  const now = Math.floor(Date.now() / 1000);
  const body = `${part({ alg: "HS256", typ: "JWT" })}.${part({ sub: "js-client", iat: now, exp: now + ttlSeconds, publish: ["**"], subscribe: ["**"], ...claims })}`;
  return `${body}.${createHmac("sha256", secret).update(body).digest("base64url")}`;
}
