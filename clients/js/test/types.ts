// What the server takes, the types take: checked by `tsc --noEmit -p
// test` (tests/api/js_client.rs). Each line is something the server
// accepts that a too-narrow type would refuse to compile.
import type { Agent } from "../src/tidings.js";

// An agent without a kind (the server's schema requires only `id`).
export const agentWithoutKind: Agent = { id: "persona:mendel" };
export const agentWithKind: Agent = { id: "persona:mendel", kind: "ai_persona" };
