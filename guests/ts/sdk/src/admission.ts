/**
 * Admission: a plugin class that also validates or mutates objects before the API server
 * stores them — the validating and mutating webhooks of a controller, in the same
 * component as its reconciler. The host serves them (the plugin TOML's `[[admission]]`
 * sections say which requests reach it).
 *
 * ```ts
 * class Policy {
 *   constructor(_settings: {}) {}
 *   reconcile(_request: Request): Action { return Action.done; }
 *   validate(request: AdmissionRequest<ConfigMap>): void {
 *     if (!request.object?.data) throw Denied.invalid("data is required");
 *   }
 *   mutate(request: AdmissionRequest<ConfigMap>): ConfigMap | void {
 *     const cm = request.object!;
 *     cm.metadata.labels = { ...cm.metadata.labels, tier: "web" };
 *     return cm;
 *   }
 * }
 * export const reconciler = exportPlugin(Policy);
 * export const validator = exportValidator(Policy);
 * export const mutator = exportMutator(Policy);
 * ```
 *
 * Exporting `validator` or `mutator` builds the component of the `validating-plugin`,
 * `mutating-plugin` or `admitting-plugin` world (build.mjs picks it from the entry
 * module's exports); the host reads from the component's exports which it has.
 *
 * Invariants:
 * - Throwing {@link Denied} refuses the request with its message and code; a `HostError`
 *   (a failed cache read, say) refuses it with the error's message, code 500. Any other
 *   exception is logged and rethrown: the call traps, and the webhook's failure policy
 *   answers (the request is neither silently admitted nor refused as invalid).
 * - A mutation is sent as the JSON patch from the object as received to the object
 *   `mutate` returned (or changed in place): objects field by field, arrays whole.
 * - Warnings added with {@link AdmissionRequest.warn} go to the client whatever the answer.
 */
import type { Gvk } from "wasmctrl:controller/types@0.2.1";
import type {
  AdmissionRequest as WitRequest,
  Verdict as WitVerdict,
} from "wasmctrl:controller/admission@0.2.1";
import type { Mutation as WitMutation } from "wasmctrl:controller/mutator@0.2.1";
import { HostError } from "./errors.js";
import * as log from "./log.js";
import { decode, type KubeObject } from "./objects.js";
import { currentPlugin, type Plugin, type PluginClass } from "./plugin.js";

/** The operation being admitted. */
export type Operation = "CREATE" | "UPDATE" | "DELETE" | "CONNECT";

/** Who sent the request. */
export interface UserInfo {
  username: string;
  uid: string;
  groups: string[];
  extra: Record<string, string[]>;
}

/** Refuses a request: `kubectl` shows the message. `code` is the HTTP code (403 if unset). */
export class Denied extends Error {
  readonly code?: number;
  constructor(message: string, code?: number) {
    super(message);
    this.name = "Denied";
    this.code = code;
  }
  /** Refused because the object is invalid (422). */
  static invalid(message: string): Denied {
    return new Denied(message, 422);
  }
}

/** An admission request, as the API server sent it. */
export class AdmissionRequest<T extends KubeObject = KubeObject> {
  readonly warnings: string[] = [];
  constructor(
    readonly uid: string,
    readonly kind: Gvk,
    readonly resource: string,
    readonly subResource: string | undefined,
    readonly name: string,
    readonly namespace: string | undefined,
    readonly operation: Operation,
    readonly userInfo: UserInfo,
    /** The object as it would be stored (undefined on delete). */
    public object: T | undefined,
    /** The object as stored now (update, delete). */
    readonly oldObject: T | undefined,
    readonly dryRun: boolean,
    readonly options: unknown,
  ) {}

  /** Adds a warning for the client, whatever the answer. */
  warn(message: string): void {
    this.warnings.push(message);
  }
}

/** A plugin that validates. */
export interface Validating extends Plugin {
  validate(request: AdmissionRequest): void;
}

/** A plugin that mutates: returns the changed object, or changes `request.object`. */
export interface Mutating extends Plugin {
  mutate(request: AdmissionRequest): KubeObject | void;
}

/** The `validator` export of a component. */
export interface ValidatorExport {
  validate(request: WitRequest): WitVerdict;
}

/** The `mutator` export of a component. */
export interface MutatorExport {
  mutate(request: WitRequest): WitMutation;
}

function fromWit(r: WitRequest): AdmissionRequest {
  const extra: Record<string, string[]> = {};
  for (const [k, v] of r.userInfo.extra) extra[k] = v;
  return new AdmissionRequest(
    r.uid,
    r.kind,
    r.resource,
    r.subResource,
    r.name,
    r.namespace,
    r.operation.toUpperCase() as Operation,
    { username: r.userInfo.username, uid: r.userInfo.uid, groups: r.userInfo.groups, extra },
    r.object === undefined ? undefined : decode<KubeObject>(r.object),
    r.oldObject === undefined ? undefined : decode<KubeObject>(r.oldObject),
    r.dryRun,
    r.options === undefined ? undefined : decode<unknown>(r.options),
  );
}

/** Runs `f` for `request`: its verdict (a refusal from `Denied` or a `HostError`). */
function verdict(request: AdmissionRequest, what: string, f: () => void): WitVerdict {
  try {
    f();
    return { denial: undefined, warnings: request.warnings };
  } catch (e) {
    if (e instanceof Denied) {
      return { denial: { message: e.message, code: e.code }, warnings: request.warnings };
    }
    if (e instanceof HostError) {
      return { denial: { message: e.message, code: 500 }, warnings: request.warnings };
    }
    const message = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
    log.error(`${what} threw`, { error: message, stack: e instanceof Error ? (e.stack ?? "") : "" });
    throw e;
  }
}

function instance<T>(method: string): T {
  const plugin = currentPlugin();
  if (plugin === undefined || typeof (plugin as unknown as Record<string, unknown>)[method] !== "function") {
    throw new Error(`the plugin has no ${method} method, or was called before init`);
  }
  return plugin as unknown as T;
}

/**
 * The `validator` export for `cls` (which must define `validate`). Use as
 * `export const validator = exportValidator(MyPlugin);` beside `exportPlugin`.
 */
export function exportValidator<S>(cls: PluginClass<S> & { prototype: { validate: unknown } }): ValidatorExport {
  void cls;
  return {
    validate(wit) {
      const request = fromWit(wit);
      return verdict(request, "validate", () => instance<Validating>("validate").validate(request));
    },
  };
}

/**
 * The `mutator` export for `cls` (which must define `mutate`). Use as
 * `export const mutator = exportMutator(MyPlugin);` beside `exportPlugin`.
 */
export function exportMutator<S>(cls: PluginClass<S> & { prototype: { mutate: unknown } }): MutatorExport {
  void cls;
  return {
    mutate(wit) {
      const request = fromWit(wit);
      // A second decode of the bytes: the copy `mutate` cannot touch.
      const before = wit.object === undefined ? undefined : decode<KubeObject>(wit.object);
      let after: KubeObject | undefined;
      const v = verdict(request, "mutate", () => {
        if (request.operation !== "CREATE" && request.operation !== "UPDATE") return;
        const returned = instance<Mutating>("mutate").mutate(request);
        after = returned ?? request.object;
      });
      if (v.denial !== undefined || before === undefined || after === undefined) {
        return { verdict: v, patch: undefined };
      }
      const ops = diff(before, after, "");
      const patch = ops.length === 0 ? undefined : new TextEncoder().encode(JSON.stringify(ops));
      return { verdict: v, patch };
    },
  };
}

/** One RFC 6902 operation. */
export type PatchOp = { op: "add" | "replace"; path: string; value: unknown } | { op: "remove"; path: string };

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function pointer(path: string, key: string): string {
  return `${path}/${key.replace(/~/g, "~0").replace(/\//g, "~1")}`;
}

/**
 * The JSON patch from `a` to `b`: objects compared key by key, anything else (arrays
 * included) replaced whole when it differs. Written here rather than taken from an npm
 * package: it is the one algorithm the SDK needs, and every admitting plugin's bundle
 * (and the pinned toolchain) stays free of another runtime dependency.
 */
export function diff(a: unknown, b: unknown, path: string): PatchOp[] {
  if (isObject(a) && isObject(b)) {
    const ops: PatchOp[] = [];
    for (const key of Object.keys(a)) {
      if (!(key in b)) ops.push({ op: "remove", path: pointer(path, key) });
    }
    for (const [key, value] of Object.entries(b)) {
      if (!(key in a)) ops.push({ op: "add", path: pointer(path, key), value });
      else ops.push(...diff(a[key], value, pointer(path, key)));
    }
    return ops;
  }
  return JSON.stringify(a) === JSON.stringify(b) ? [] : [{ op: "replace", path, value: b }];
}
