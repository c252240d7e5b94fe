// Builds every TypeScript guest into a WebAssembly component.
//
// Usage: node guests/ts/build.mjs --tools DIR --out DIR
//   --tools  a directory holding node_modules installed from guests/ts/package-lock.json
//            (`cargo xtask build-guests` runs `npm ci` there, outside the clone)
//   --out    where <plugin>.wasm files go
//   --wit    the WIT package (default: wit/ of the repository)
//
// Steps: the SDK package is linked into node_modules/; `jco guest-types` writes the WIT's
// TypeScript declarations into generated/ (of the `admitting-plugin` world, which has every
// interface); `tsc` type-checks the SDK and every plugin; each plugin's native tests
// (`tests/*.test.ts`) run on the SDK's fake host (`sdk/tools/test.mjs`, with `node
// --test`); for each plugin directory (examples/*, test-plugins/*, template) esbuild
// bundles src/index.ts with the SDK into one ES module and componentize-js turns it into a
// component, with WASI HTTP disabled, of the world its exports ask for: `plugin` for
// `reconciler` alone, `validating-plugin` / `mutating-plugin` / `admitting-plugin` when the
// module also exports `validator` / `mutator` / both (the host reads the component's
// exports to know which webhooks it can answer). A plugin is rebuilt only when its inputs (its sources, the SDK, wit/, the
// lock file) changed since the stamp next to its .wasm was written.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "../..");

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  if (i < 0 || i + 1 >= process.argv.length) {
    if (fallback !== undefined) return fallback;
    throw new Error(`missing ${name} DIR (usage: node build.mjs --tools DIR --out DIR [--wit DIR])`);
  }
  return resolve(process.argv[i + 1]);
}

const tools = arg("--tools");
const out = arg("--out");
const wit = arg("--wit", join(root, "wit"));
const bin = (name) => join(tools, "node_modules", ".bin", name);

function run(cmd, args) {
  console.error(`ts-guests: ${cmd} ${args.join(" ")}`);
  try {
    execFileSync(cmd, args, { stdio: "inherit", cwd: here });
  } catch (e) {
    console.error(`ts-guests: ${cmd} failed (${e.status === null ? e.signal : `exit ${e.status}`})`);
    process.exit(1);
  }
}

function files(dir) {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    return e.isDirectory() ? (e.name === "node_modules" ? [] : files(p)) : [p];
  });
}

function digest(paths) {
  const h = createHash("sha256");
  for (const p of paths.sort()) {
    h.update(relative(root, p));
    h.update(readFileSync(p));
  }
  return h.digest("hex");
}

const plugins = [
  ...readdirSync(join(here, "examples")).map((d) => ({ dir: join(here, "examples", d), name: `${d}-ts` })),
  ...readdirSync(join(here, "test-plugins")).map((d) => ({
    dir: join(here, "test-plugins", d),
    name: `test-plugin-ts-${d}`,
  })),
  { dir: join(here, "template"), name: "template-ts" },
].filter((p) => statSync(p.dir).isDirectory() && existsSync(join(p.dir, "src", "index.ts")));

mkdirSync(out, { recursive: true });

// The plugins import the SDK as the package `@wasmctrl/guest` (sdk/package.json), as a
// plugin outside this repository does after `npm install <sdk>`; here it is linked into
// node_modules/ the way npm links a workspace or `file:` dependency, so tsc and esbuild
// resolve it by its `exports` like any package.
const link = join(here, "node_modules", "@wasmctrl", "guest");
const target = relative(dirname(link), join(here, "sdk"));
if (!(existsSync(link) && lstatSync(link).isSymbolicLink() && readlinkSync(link) === target)) {
  rmSync(link, { recursive: true, force: true });
  mkdirSync(dirname(link), { recursive: true });
  symlinkSync(target, link, "junction");
}

// Declarations of an earlier WIT or world would otherwise stay beside the new ones.
rmSync(join(here, "generated"), { recursive: true, force: true });
run(bin("jco"), ["guest-types", wit, "--world-name", "admitting-plugin", "--out-dir", join(here, "generated"), "--quiet"]);

/** The world a bundle's exports ask for (from esbuild's metafile). */
function worldOf(metafile, bundle) {
  const meta = JSON.parse(readFileSync(metafile, "utf8"));
  const output = Object.entries(meta.outputs).find(([path]) => resolve(here, path) === resolve(bundle));
  const exports = new Set(output ? output[1].exports : []);
  if (!exports.has("reconciler")) {
    console.error(`ts-guests: ${bundle} does not export \`reconciler\` (export const reconciler = exportPlugin(...))`);
    process.exit(1);
  }
  const validates = exports.has("validator");
  const mutates = exports.has("mutator");
  if (validates && mutates) return "admitting-plugin";
  if (validates) return "validating-plugin";
  if (mutates) return "mutating-plugin";
  return "plugin";
}
run(bin("tsc"), ["--project", join(here, "tsconfig.json")]);

const tests = plugins.flatMap((p) => files(join(p.dir, "tests")).filter((f) => f.endsWith(".test.ts")));
if (tests.length > 0) {
  run(process.execPath, [join(here, "sdk", "tools", "test.mjs"), "--tools", tools, "--out", join(out, ".tests"), ...tests]);
}

const shared = [...files(join(here, "sdk", "src")), ...files(wit), join(here, "package-lock.json"), join(here, "build.mjs")];
for (const p of plugins) {
  const wasm = join(out, `${p.name}.wasm`);
  const stampFile = join(out, `${p.name}.stamp`);
  const stamp = digest([...shared, ...files(join(p.dir, "src"))]);
  if (existsSync(wasm) && existsSync(stampFile) && readFileSync(stampFile, "utf8") === stamp) {
    console.error(`ts-guests: ${p.name} is up to date`);
    continue;
  }
  const bundle = join(out, `${p.name}.js`);
  const metafile = join(out, `${p.name}.meta.json`);
  run(bin("esbuild"), [
    join(p.dir, "src", "index.ts"),
    "--bundle",
    "--format=esm",
    "--platform=neutral",
    "--target=es2022",
    "--external:wasmctrl:*",
    `--outfile=${bundle}`,
    `--metafile=${metafile}`,
    "--log-level=warning",
  ]);
  const world = worldOf(metafile, bundle);
  const tmp = join(out, `.${p.name}.wasm.tmp`);
  run(bin("componentize-js"), [bundle, "--wit", wit, "--world-name", world, "--disable", "http", "fetch-event", "--out", tmp]);
  renameSync(tmp, wasm);
  writeFileSync(stampFile, stamp);
}
