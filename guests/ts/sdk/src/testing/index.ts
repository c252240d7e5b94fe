/**
 * A fake host for testing a plugin natively under Node: an in-memory stand-in for the
 * host's imports (cache, client, events, log, config), the TypeScript twin of the Python
 * SDK's `wasmctrl_guest.testing`.
 *
 * ```ts
 * import { test } from "node:test";
 * import assert from "node:assert/strict";
 * import { FakeHost } from "@wasmctrl/guest/testing";
 * import { reconciler } from "../src/index.ts";
 *
 * test("stamps a ConfigMap", () => {
 *   const host = new FakeHost().install();
 *   host.put({ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "a", namespace: "default" } });
 *   reconciler.init(host.settingsJson({ value: "yes" }));
 *   assert.deepEqual(reconciler.reconcile({ namespace: "default", name: "a" }), { tag: "done" });
 *   assert.deepEqual(host.writes, ["patch default/a"]);
 * });
 * ```
 *
 * Run tests with the SDK's runner, `node <sdk>/tools/test.mjs tests/*.test.ts`, which
 * bundles each file with esbuild, links the `wasmctrl:controller/*` imports to this fake,
 * and runs the bundles with `node --test`.
 *
 * Invariants:
 * - One store: objects live in one map keyed by apiVersion, kind, namespace and name; the
 *   cache reads it and the client writes it, so a write is visible to the next read (the
 *   real host's cache catches up with a watch; a test that needs the lag edits the store).
 * - Every successful write is recorded in `writes` as `"<verb> <namespace>/<name>"`
 *   (create, replace, patch, patch-status, update-status, apply, delete), every Event in
 *   `events`, every log line in `logs`; a refused write records nothing.
 * - Writes follow the API server where the SDK relies on it: a resourceVersion or uid that
 *   no longer matches is a `conflict`, a missing object `not-found`, an existing one on
 *   create `already-exists`; deleting an object with finalizers marks it
 *   (`deletionTimestamp`), and removing the last finalizer of a marked object deletes it.
 *   Only merge patches are modelled (a JSON or strategic patch is `invalid`), and apply
 *   is approximated as a merge patch (or a create).
 *
 * Admission exports are called directly, with {@link admissionRequest} building what the
 * host would hand them and {@link patchOf} reading a mutation's JSON patch back:
 *
 * ```ts
 * reconciler.init(host.settingsJson({}));
 * const verdict = validator.validate(admissionRequest("create", cm));
 * assert.deepEqual(verdict.denial, { message: "data is required", code: 422 });
 * assert.deepEqual(patchOf(mutator.mutate(admissionRequest("create", cm))), [...]);
 * ```
 */
import type {
  AdmissionRequest as WitAdmissionRequest,
  Operation as WitOperation,
  UserInfo as WitUserInfo,
} from "wasmctrl:controller/admission@0.2.1";
import type { Mutation as WitMutation } from "wasmctrl:controller/mutator@0.2.1";
import type { Error as WitError, Gvk } from "wasmctrl:controller/types@0.2.1";
import type { KubeObject } from "../objects.js";

/** A log line the plugin wrote. */
export interface LogLine {
  level: "trace" | "debug" | "info" | "warn" | "error";
  message: string;
  fields: Record<string, string>;
}

/** An Event the plugin published. */
export interface RecordedEvent {
  regarding: { kind: Gvk; namespace?: string; name: string };
  type: "normal" | "warning";
  reason: string;
  action: string;
  note: string;
}

/** The host call a failure is injected into. */
export type Operation =
  | "cache.get"
  | "cache.list"
  | "cache.by-index"
  | "get"
  | "create"
  | "replace"
  | "patch"
  | "patch-status"
  | "update-status"
  | "apply"
  | "delete"
  | "publish";

/** Options of {@link FakeHost}. */
export interface FakeHostOptions {
  /** The indexes the plugin's TOML declares: name → the values an object is indexed under. */
  indexes?: Record<string, (object: KubeObject) => string[]>;
  /** The plugin's name (`config.pluginName()`). */
  pluginName?: string;
  /** The `[settings]` table (`config.settings()`). */
  settings?: unknown;
}

let installed: FakeHost | undefined;

/** The host the imports talk to; throws when no test installed one. */
export function installedHost(): FakeHost {
  if (installed === undefined) {
    throw new Error("no FakeHost is installed: call `new FakeHost().install()` first");
  }
  return installed;
}

/** The in-memory host. See the module's documentation. */
export class FakeHost {
  /** The store, by {@link FakeHost.keyOf}. */
  readonly objects = new Map<string, KubeObject>();
  /** Every successful write, as `"<verb> <namespace>/<name>"`. */
  readonly writes: string[] = [];
  readonly events: RecordedEvent[] = [];
  readonly logs: LogLine[] = [];
  readonly indexes: Record<string, (object: KubeObject) => string[]>;
  pluginName: string;
  settings: unknown;
  private readonly failures: { op: Operation; error: WitError }[] = [];
  private resourceVersion = 100;
  private uids = 0;

  constructor(options: FakeHostOptions = {}) {
    this.indexes = options.indexes ?? {};
    this.pluginName = options.pluginName ?? "test-plugin";
    this.settings = options.settings ?? {};
  }

  /** Makes this the host every import talks to (until another one is installed). */
  install(): this {
    installed = this;
    return this;
  }

  /** The JSON bytes of `settings`, as the host hands them to `reconciler.init`. */
  settingsJson(settings: unknown = this.settings): Uint8Array {
    this.settings = settings;
    return new TextEncoder().encode(JSON.stringify(settings));
  }

  /** Stores a copy of `object` (a new resourceVersion; a uid when it has none); returns it. */
  put<T extends KubeObject>(object: T): T {
    const stored = clone(object);
    const meta = stored.metadata;
    if (meta.uid === undefined) {
      this.uids += 1;
      meta.uid = `uid-${this.uids}`;
    }
    this.resourceVersion += 1;
    meta.resourceVersion = String(this.resourceVersion);
    this.objects.set(FakeHost.keyOf(stored), stored);
    return clone(stored);
  }

  /** A copy of the stored object, or `undefined`. */
  get<T extends KubeObject = KubeObject>(kind: Gvk, namespace: string | undefined, name: string): T | undefined {
    const o = this.objects.get(FakeHost.key(kind, namespace, name));
    return o === undefined ? undefined : clone(o as T);
  }

  /** Removes the object from the store at once (as if the API server had deleted it). */
  remove(kind: Gvk, namespace: string | undefined, name: string): boolean {
    return this.objects.delete(FakeHost.key(kind, namespace, name));
  }

  /** Makes the next call of `op` fail with `error` (e.g. `{ tag: "conflict", val: "changed" }`). */
  failNext(op: Operation, error: WitError): void {
    this.failures.push({ op, error });
  }

  /** Throws the failure injected for `op`, if any (what the imports call first). */
  checkFailure(op: Operation): void {
    const i = this.failures.findIndex((f) => f.op === op);
    if (i >= 0) {
      const [{ error }] = this.failures.splice(i, 1);
      throw { payload: error };
    }
  }

  /** Every stored object of `kind` (sorted by key), optionally in `namespace`. */
  objectsOf(kind: Gvk, namespace?: string): KubeObject[] {
    return [...this.objects.entries()]
      .filter(([, o]) => o.apiVersion === kind.apiVersion && o.kind === kind.kind)
      .filter(([, o]) => namespace === undefined || o.metadata.namespace === namespace)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([, o]) => clone(o));
  }

  /** Records a write (called by the fake client after it succeeded). */
  recordWrite(verb: string, namespace: string | undefined, name: string): void {
    this.writes.push(`${verb} ${namespace ?? ""}/${name}`);
  }

  /** Hands out the next resourceVersion. */
  nextResourceVersion(): string {
    this.resourceVersion += 1;
    return String(this.resourceVersion);
  }

  static key(kind: Gvk, namespace: string | undefined, name: string): string {
    return JSON.stringify([kind.apiVersion, kind.kind, namespace ?? null, name]);
  }

  static keyOf(object: KubeObject): string {
    if (object.apiVersion === undefined || object.kind === undefined || object.metadata.name === undefined) {
      throw new Error("a stored object needs apiVersion, kind and metadata.name");
    }
    return FakeHost.key({ apiVersion: object.apiVersion, kind: object.kind }, object.metadata.namespace, object.metadata.name);
  }
}

/** The fields of {@link admissionRequest} a test may set; the others get the defaults shown. */
export interface AdmissionRequestOptions {
  /** The object as stored now (update, delete); encoded as JSON. */
  oldObject?: KubeObject;
  /** Default: `"test-uid"`. */
  uid?: string;
  /** Default: the kind lower-cased with an `s` (`configmaps`); set it for other plurals. */
  resource?: string;
  subResource?: string;
  /** Default: `{ username: "test-user", uid: "", groups: [], extra: [] }`. */
  userInfo?: WitUserInfo;
  /** Default: false. */
  dryRun?: boolean;
  /** The operation's options (`CreateOptions`...); encoded as JSON. */
  options?: unknown;
}

/**
 * The WIT `admission-request` the host hands to the `validator` / `mutator` exports, for
 * `operation` on `object` (undefined on delete): the objects JSON-encoded, and the kind,
 * name and namespace read from `object`, else from `options.oldObject`.
 */
export function admissionRequest(
  operation: WitOperation,
  object: KubeObject | undefined,
  options: AdmissionRequestOptions = {},
): WitAdmissionRequest {
  const subject = object ?? options.oldObject;
  if (subject?.apiVersion === undefined || subject.kind === undefined) {
    throw new Error("admissionRequest needs an object (or oldObject) with apiVersion and kind");
  }
  const encode = (v: unknown) => (v === undefined ? undefined : new TextEncoder().encode(JSON.stringify(v)));
  return {
    uid: options.uid ?? "test-uid",
    kind: { apiVersion: subject.apiVersion, kind: subject.kind },
    resource: options.resource ?? `${subject.kind.toLowerCase()}s`,
    subResource: options.subResource,
    name: subject.metadata.name ?? "",
    namespace: subject.metadata.namespace,
    operation,
    userInfo: options.userInfo ?? { username: "test-user", uid: "", groups: [], extra: [] },
    object: encode(object),
    oldObject: encode(options.oldObject),
    dryRun: options.dryRun ?? false,
    options: encode(options.options),
  };
}

/** The JSON patch of a `mutator.mutate` answer, decoded (`undefined` when it changes nothing). */
export function patchOf(mutation: WitMutation): unknown[] | undefined {
  return mutation.patch === undefined ? undefined : (JSON.parse(new TextDecoder().decode(mutation.patch)) as unknown[]);
}

/** A deep copy of a JSON value (objects in the store are never shared with the plugin). */
export function clone<T>(value: T): T {
  return JSON.parse(JSON.stringify(value)) as T;
}
