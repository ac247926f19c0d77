// Builds the client: `tsc` checks the source and writes one declaration file
// per module, and esbuild bundles the modules into the one file the package
// ships and every tidings server serves at `/tidings.js`.
// `node build.mjs [dir]` writes into `dir` (default `dist`); the suite builds
// into a scratch directory and compares it with the committed `dist`.
import { execFileSync } from "node:child_process";
import { rmSync } from "node:fs";
import { build } from "esbuild";

const out = process.argv[2] ?? "dist";
rmSync(out, { recursive: true, force: true });
execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", ".", "--outDir", out], { stdio: "inherit" });
await build({
  entryPoints: ["src/tidings.ts"],
  bundle: true,
  format: "esm",
  target: "es2022",
  outfile: `${out}/tidings.js`,
  logLevel: "warning",
});
