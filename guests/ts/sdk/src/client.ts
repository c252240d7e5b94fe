/**
 * Writes (and live reads) through the host's Kubernetes client. Every call is checked
 * against the plugin's `permissions.write` and carries its field manager; failures throw
 * a {@link HostError}.
 */
import * as wit from "wasmctrl:controller/client@0.2.1";
import { hostCall } from "./errors.js";
import { decode, encode, type Kind, type KubeObject } from "./objects.js";

/** How a patch body is read: RFC 7386 merge, RFC 6902 JSON patch, or strategic merge. */
export type PatchType = "merge" | "json" | "strategic";

/** Reads the object from the API server, bypassing the cache. */
export function get<T extends KubeObject>(kind: Kind<T>, namespace: string | undefined, name: string): T {
  return decode<T>(hostCall(() => wit.get(gvk(kind), namespace, name)));
}

/** Creates `object`; returns the stored object. */
export function create<T extends KubeObject>(object: T): T {
  return decode<T>(hostCall(() => wit.create(encode(object))));
}

/** Replaces the object; its `metadata.resourceVersion`, when set, makes this a compare-and-swap. */
export function replace<T extends KubeObject>(object: T): T {
  return decode<T>(hostCall(() => wit.replace(encode(object))));
}

/** Patches the object's main resource. */
export function patch<T extends KubeObject>(
  kind: Kind<T>,
  namespace: string | undefined,
  name: string,
  body: unknown,
  type: PatchType = "merge",
): T {
  return decode<T>(hostCall(() => wit.patch(gvk(kind), namespace, name, { tag: type, val: encode(body) })));
}

/** Patches the object's `status` subresource. */
export function patchStatus<T extends KubeObject>(
  kind: Kind<T>,
  namespace: string | undefined,
  name: string,
  body: unknown,
  type: PatchType = "merge",
): T {
  return decode<T>(hostCall(() => wit.patchStatus(gvk(kind), namespace, name, { tag: type, val: encode(body) })));
}

/** Replaces the object's `status` subresource. */
export function updateStatus<T extends KubeObject>(object: T): T {
  return decode<T>(hostCall(() => wit.updateStatus(encode(object))));
}

/** Options of {@link apply}. */
export interface ApplyOptions {
  /** Take over fields owned by other managers instead of failing with `conflict`. */
  force?: boolean;
  /** Validate and return the result without persisting it (`dryRun=All`). */
  dryRun?: boolean;
  /** Another field manager than the plugin's own. */
  fieldManager?: string;
}

/** Server-side apply of a (partial) object. */
export function apply<T extends KubeObject>(object: T, options: ApplyOptions = {}): T {
  const opts = { force: options.force ?? false, dryRun: options.dryRun ?? false, fieldManager: options.fieldManager };
  return decode<T>(hostCall(() => wit.apply(encode(object), opts)));
}

/** Options of {@link del}. */
export interface DeleteOptions {
  /** Fail with `conflict` unless the object still has this UID. */
  uid?: string;
  /** Fail with `conflict` unless the object still has this resourceVersion. */
  resourceVersion?: string;
  propagation?: "background" | "foreground" | "orphan";
}

/**
 * Deletes the object (an object with finalizers is only marked for deletion). A missing
 * object throws a `not-found` {@link HostError}, as in every SDK; where absence is fine,
 * wrap the call: `ignoreNotFound(() => client.delete(...))`.
 */
export function del(kind: Kind, namespace: string | undefined, name: string, options: DeleteOptions = {}): void {
  const opts = { uid: options.uid, resourceVersion: options.resourceVersion, propagation: options.propagation };
  hostCall(() => wit.delete(gvk(kind), namespace, name, opts));
}

export { del as delete };

function gvk(kind: Kind): { apiVersion: string; kind: string } {
  return { apiVersion: kind.apiVersion, kind: kind.kind };
}
