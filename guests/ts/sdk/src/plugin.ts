/**
 * Turns a plugin class into the `reconciler` export the host calls.
 *
 * A plugin is a class whose constructor receives the `[settings]` table (a plain object),
 * whose `static forKind` names the kind the plugin was written for (the host refuses a
 * TOML whose `[for]` differs), and whose `reconcile(target)` returns an {@link Action} (or
 * nothing, meaning done). The optional hooks `onAdd`, `onUpdate`, `onDelete`, `map` and
 * `filter` are declared to the host exactly when the class defines them.
 *
 * Invariants:
 * - `init` constructs one plugin object per instance; a constructor that throws, or a
 *   class without `forKind`, rejects this version of the plugin with the message.
 * - `reconcile` is handed a {@link Target}: the SDK reads the queued key's `forKind` object
 *   from the host's cache first (as the Rust SDK does), so `target.object` is the object as
 *   cached when the call started, or `undefined` when the cache has none (it was deleted).
 *   A failed cache read ends the call with the HostError's outcome, before the plugin runs.
 * - `reconcile` never lets an exception reach the component boundary: RetryableError and
 *   TerminalError map to their WIT cases, a HostError to retryable or terminal by its
 *   kind, anything else to retryable with the exception's message (logged with its stack).
 * - Hooks (`map`, `filter`, `onAdd`, ...) are not `result`s in the WIT: an exception there
 *   is logged and then rethrown, which traps the call; the host discards that instance.
 */
import type { Gvk, Request } from "wasmctrl:controller/types@0.2.1";
import type {
  FilterEvent,
  PluginInfo,
  ReconcileError,
  ReconcileResult,
} from "wasmctrl:controller/reconciler@0.2.1";
import { HostError, RetryableError, TerminalError } from "./errors.js";
import * as cache from "./cache.js";
import * as log from "./log.js";
import { decode, type Kind, type KubeObject } from "./objects.js";

/**
 * What `reconcile` is handed, the TypeScript form of the Rust SDK's `Target`: the request
 * being reconciled and its object as the host's cache has it — `undefined` when the cache
 * has no object under that key, because it was deleted (or never existed).
 */
export interface Target<T extends KubeObject = KubeObject> {
  /** The key being reconciled (`namespace`, `name`). */
  readonly request: Request;
  /** The cached object; `undefined` when it is gone: clean up whatever it left behind. */
  readonly object: T | undefined;
}

/** How a reconcile ended well. */
export type Action = { type: "done" } | { type: "requeue" } | { type: "requeue-after"; ms: number };

export const Action = {
  /** Done until something changes. */
  done: { type: "done" } as Action,
  /** Reconcile again after the rate limiter's backoff. */
  requeue: { type: "requeue" } as Action,
  /** Reconcile again after `ms` milliseconds. */
  requeueAfter(ms: number): Action {
    return { type: "requeue-after", ms };
  },
};

/** A filter question: which event of which object(s). */
export type FilterInput =
  | { type: "create"; object: KubeObject }
  | { type: "update"; old: KubeObject; new: KubeObject }
  | { type: "delete"; object: KubeObject };

/** What a plugin object implements. Only `reconcile` is required. */
export interface Plugin<T extends KubeObject = KubeObject> {
  reconcile(target: Target<T>): Action | void;
  onAdd?(kind: Gvk, object: KubeObject, inInitialList: boolean): void;
  onUpdate?(kind: Gvk, old: KubeObject, updated: KubeObject): void;
  onDelete?(kind: Gvk, object: KubeObject, finalStateUnknown: boolean): void;
  map?(kind: Gvk, object: KubeObject): Request[];
  filter?(kind: Gvk, event: FilterInput): boolean;
}

/** A plugin class: `new (settings) => Plugin`, with `static forKind` (the kind it reconciles). */
export interface PluginClass<S, T extends KubeObject = KubeObject> {
  new (settings: S): Plugin<T>;
  forKind: Kind<T>;
}

/** The `reconciler` export of a component. */
export interface ReconcilerExport {
  init(settings: Uint8Array): PluginInfo;
  reconcile(request: Request): ReconcileResult;
  onAdd(kind: Gvk, object: Uint8Array, inInitialList: boolean): void;
  onUpdate(kind: Gvk, old: Uint8Array, updated: Uint8Array): void;
  onDelete(kind: Gvk, object: Uint8Array, finalStateUnknown: boolean): void;
  map(kind: Gvk, object: Uint8Array): Request[];
  filter(kind: Gvk, event: FilterEvent): boolean;
}

/** The plugin object `init` built in this instance (the admission exports use it too). */
let current: Plugin | undefined;

/** The plugin object of this instance, once `init` built it. */
export function currentPlugin(): Plugin | undefined {
  return current;
}

/**
 * The `reconciler` export for `cls`. Use as
 * `export const reconciler = exportPlugin(MyPlugin);` in the component's entry module.
 */
export function exportPlugin<S, T extends KubeObject>(cls: PluginClass<S, T>): ReconcilerExport {
  let plugin: Plugin<T> | undefined;
  const instance = (): Plugin<T> => {
    if (plugin === undefined) {
      throw new Error("the host called the plugin before init");
    }
    return plugin;
  };
  const proto = cls.prototype as Partial<Plugin>;
  return {
    init(settings) {
      try {
        if (cls.forKind === undefined) {
          throw new Error(`${cls.name} has no \`static forKind\` (the kind it reconciles, e.g. kinds.ConfigMap)`);
        }
        plugin = new cls(decode<S>(settings));
        current = plugin as Plugin;
      } catch (e) {
        throw errPayload(e instanceof Error ? e.message : String(e));
      }
      const hooks = {
        onAdd: typeof proto.onAdd === "function",
        onUpdate: typeof proto.onUpdate === "function",
        onDelete: typeof proto.onDelete === "function",
        map: typeof proto.map === "function",
        filter: typeof proto.filter === "function",
      };
      const forKind = { apiVersion: cls.forKind.apiVersion, kind: cls.forKind.kind };
      return { hooks, forKind };
    },
    reconcile(request) {
      let action: Action | void;
      try {
        action = instance().reconcile(target(cls.forKind, request));
      } catch (e) {
        throw errPayload(reconcileError(e));
      }
      switch (action?.type ?? "done") {
        case "requeue":
          return { tag: "requeue" };
        case "requeue-after": {
          const ms = Math.max(0, Math.round((action as { ms: number }).ms));
          return { tag: "requeue-after-ms", val: BigInt(ms) };
        }
        default:
          return { tag: "done" };
      }
    },
    onAdd(kind, object, inInitialList) {
      hook("on-add", () => instance().onAdd?.(kind, decode(object), inInitialList));
    },
    onUpdate(kind, old, updated) {
      hook("on-update", () => instance().onUpdate?.(kind, decode(old), decode(updated)));
    },
    onDelete(kind, object, finalStateUnknown) {
      hook("on-delete", () => instance().onDelete?.(kind, decode(object), finalStateUnknown));
    },
    map(kind, object) {
      return hook("map", () => instance().map?.(kind, decode(object)) ?? []);
    },
    filter(kind, event) {
      return hook("filter", () => instance().filter?.(kind, filterInput(event)) ?? true);
    },
  };
}

/** Reads the request's object of `kind` from the cache (a failure names the key). */
function target<T extends KubeObject>(kind: Kind<T>, request: Request): Target<T> {
  try {
    return { request, object: cache.get(kind, request.namespace, request.name) };
  } catch (e) {
    if (e instanceof HostError) {
      const key = request.namespace === undefined ? request.name : `${request.namespace}/${request.name}`;
      const message = `reading ${kind.kind} ${key} from the cache: ${e.message}`;
      throw e.retryable ? new RetryableError(message) : new TerminalError(message);
    }
    throw e;
  }
}

function filterInput(event: FilterEvent): FilterInput {
  switch (event.tag) {
    case "create":
      return { type: "create", object: decode(event.val) };
    case "update":
      return { type: "update", old: decode(event.val[0]), new: decode(event.val[1]) };
    case "delete":
      return { type: "delete", object: decode(event.val) };
  }
}

/** The WIT error for an exception out of `reconcile`. */
function reconcileError(e: unknown): ReconcileError {
  if (e instanceof TerminalError) {
    return { tag: "terminal", val: e.message };
  }
  if (e instanceof RetryableError) {
    return { tag: "retryable", val: e.message };
  }
  if (e instanceof HostError) {
    return { tag: e.retryable ? "retryable" : "terminal", val: e.message };
  }
  const message = e instanceof Error ? `${e.name}: ${e.message}` : `uncaught ${String(e)}`;
  log.error("reconcile threw", { error: message, stack: e instanceof Error ? (e.stack ?? "") : "" });
  return { tag: "retryable", val: message };
}

/** Runs a hook; an exception is logged, then rethrown (the call traps). */
function hook<T>(name: string, f: () => T): T {
  try {
    return f();
  } catch (e) {
    const message = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
    log.error(`${name} threw`, { error: message, stack: e instanceof Error ? (e.stack ?? "") : "" });
    throw e;
  }
}

/** What componentize-js lowers as the `err` case of a `result` export. */
function errPayload<E>(payload: E): { payload: E } {
  return { payload };
}
