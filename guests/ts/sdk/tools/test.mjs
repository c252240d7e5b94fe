#!/usr/bin/env node
// Runs a plugin's native tests on the SDK's fake host (`@wasmctrl/guest/testing`).
//
// Usage: node <sdk>/tools/test.mjs [--tools DIR] [--out DIR] FILE...
//   FILE     test modules (TypeScript or JavaScript) written for `node:test`
//   --tools  the directory whose node_modules holds esbuild (default: the current one)
//   --out    where the bundles go (default: a fresh directory under the system's temp dir)
//
// Each FILE is bundled by esbuild for Node with the SDK resolved to this copy of it and the
// `wasmctrl:controller/*` imports — provided by the component at run time — linked to the
// fake host's modules (src/testing/imports/); then `node --test` runs the bundles, and this
// script exits with its status. Nothing is type-checked here (tsc does that).
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const sdk = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const args = process.argv.slice(2);
const option = (name) => {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  if (i + 1 >= args.length) usage(`${name} needs a directory`);
  return resolve(args.splice(i, 2)[1]);
};
function usage(why) {
  console.error(`wasmctrl-test: ${why}\nusage: node ${join(sdk, "tools", "test.mjs")} [--tools DIR] [--out DIR] FILE...`);
  process.exit(2);
}

const tools = option("--tools") ?? process.cwd();
const out = option("--out") ?? mkdtempSync(join(tmpdir(), "wasmctrl-test-"));
const files = args.map((f) => resolve(f));
if (files.length === 0) usage("no test files given");
for (const f of files) if (!existsSync(f)) usage(`${f} does not exist`);

let esbuild;
try {
  const esbuildPath = createRequire(join(tools, "package.json")).resolve("esbuild");
  esbuild = await import(pathToFileURL(esbuildPath).href);
} catch (e) {
  usage(`esbuild is not installed under ${tools} (npm install esbuild, or pass --tools DIR): ${e.message}`);
}

/** Resolves the SDK to this copy and the host's imports to the fake host. */
const fakeHost = {
  name: "wasmctrl-fake-host",
  setup(build) {
    build.onResolve({ filter: /^wasmctrl:controller\// }, (a) => {
      const iface = /^wasmctrl:controller\/([a-z-]+)@/.exec(a.path)?.[1];
      const file = join(sdk, "src", "testing", "imports", `${iface}.ts`);
      if (iface === undefined || !existsSync(file)) {
        return { errors: [{ text: `the fake host has no ${a.path} (it fakes cache, client, config, events, log)` }] };
      }
      return { path: file };
    });
    build.onResolve({ filter: /^@wasmctrl\/guest(\/testing)?$/ }, (a) => ({
      path: join(sdk, "src", a.path.endsWith("/testing") ? "testing/index.ts" : "index.ts"),
    }));
  },
};

mkdirSync(out, { recursive: true });
const bundles = [];
for (const [i, file] of files.entries()) {
  const bundle = join(out, `${i}-${basename(file).replace(/\.[cm]?[jt]s$/, "")}.mjs`);
  await esbuild.build({
    entryPoints: [file],
    bundle: true,
    format: "esm",
    platform: "node",
    target: "node20",
    outfile: bundle,
    plugins: [fakeHost],
    logLevel: "warning",
    sourcemap: "inline",
  });
  bundles.push(bundle);
}
const run = spawnSync(process.execPath, ["--enable-source-maps", "--test", ...bundles], { stdio: "inherit" });
process.exit(run.status ?? 1);
