/**
 * Finalizers: add one before creating what needs cleaning up, remove it once cleaned up.
 * `ensureAdded` / `ensureRemoved` write only when something changes, as a merge patch of
 * `metadata.finalizers` carrying the object's resourceVersion (so a concurrent change
 * fails with `conflict` instead of being overwritten).
 */
import * as client from "./client.js";
import { HostError } from "./errors.js";
import { kind, type KubeObject } from "./objects.js";

/** Whether `o` carries `finalizer`. */
export function has(o: KubeObject, finalizer: string): boolean {
  return (o.metadata.finalizers ?? []).includes(finalizer);
}

/** `o` with `finalizer`, written to the cluster when it was missing; returns the stored object. */
export function ensureAdded<T extends KubeObject>(o: T, finalizer: string): T {
  if (has(o, finalizer)) {
    return o;
  }
  return write(o, [...(o.metadata.finalizers ?? []), finalizer], false) ?? o;
}

/**
 * `o` without `finalizer`, written when it was there; returns the stored object, or
 * `undefined` when removing the last finalizer let a deleting object go.
 */
export function ensureRemoved<T extends KubeObject>(o: T, finalizer: string): T | undefined {
  if (!has(o, finalizer)) {
    return o;
  }
  return write(o, (o.metadata.finalizers ?? []).filter((f) => f !== finalizer), true);
}

function write<T extends KubeObject>(o: T, finalizers: string[], goneIsFine: boolean): T | undefined {
  const metadata: Record<string, unknown> = { finalizers };
  if (o.metadata.resourceVersion !== undefined) {
    metadata.resourceVersion = o.metadata.resourceVersion;
  }
  const k = kind<T>(o.apiVersion ?? "", o.kind ?? "");
  try {
    return client.patch(k, o.metadata.namespace, o.metadata.name ?? "", { metadata });
  } catch (e) {
    if (goneIsFine && e instanceof HostError && e.isNotFound()) {
      return undefined;
    }
    throw e;
  }
}
