/**
 * The fake `wasmctrl:controller/client` import: writes the installed {@link FakeHost}'s
 * store with the API server's preconditions (see the invariants of `../index.ts`).
 */
import type { Gvk } from "wasmctrl:controller/types@0.2.1";
import type { KubeObject } from "../../objects.js";
import { FakeHost, clone, installedHost } from "../index.js";
import { decodeJson, encodeJson, fail, mergePatch } from "./json.js";

type PatchBody = { tag: "merge" | "json" | "strategic"; val: Uint8Array };

function gvkOf(o: KubeObject): Gvk {
  return { apiVersion: o.apiVersion ?? "", kind: o.kind ?? "" };
}

function existing(host: FakeHost, kind: Gvk, namespace: string | undefined, name: string): KubeObject {
  return host.get(kind, namespace, name) ?? fail("not-found", `${kind.kind} ${namespace ?? ""}/${name}`);
}

function checkVersion(current: KubeObject, resourceVersion: string | undefined): void {
  if (resourceVersion !== undefined && resourceVersion !== current.metadata.resourceVersion) {
    fail("conflict", `${current.metadata.name}: resourceVersion ${resourceVersion} is not the latest`);
  }
}

/** Stores `o`, or deletes it when it is marked for deletion and has no finalizer left. */
function store(host: FakeHost, o: KubeObject): KubeObject {
  if (o.metadata.deletionTimestamp && !(o.metadata.finalizers ?? []).length) {
    host.remove(gvkOf(o), o.metadata.namespace, o.metadata.name ?? "");
    return o;
  }
  return host.put(o);
}

export function get(kind: Gvk, namespace: string | undefined, name: string): Uint8Array {
  const host = installedHost();
  host.checkFailure("get");
  return encodeJson(existing(host, kind, namespace, name));
}

export function create(object: Uint8Array): Uint8Array {
  const host = installedHost();
  host.checkFailure("create");
  const o = decodeJson<KubeObject>(object);
  if (host.get(gvkOf(o), o.metadata.namespace, o.metadata.name ?? "") !== undefined) {
    fail("already-exists", `${o.kind} ${o.metadata.namespace ?? ""}/${o.metadata.name} already exists`);
  }
  delete o.metadata.resourceVersion;
  const stored = host.put(o);
  host.recordWrite("create", o.metadata.namespace, o.metadata.name ?? "");
  return encodeJson(stored);
}

function replaceWith(verb: string, object: Uint8Array, status: boolean): Uint8Array {
  const host = installedHost();
  host.checkFailure(verb === "replace" ? "replace" : "update-status");
  const o = decodeJson<KubeObject>(object);
  const current = existing(host, gvkOf(o), o.metadata.namespace, o.metadata.name ?? "");
  checkVersion(current, o.metadata.resourceVersion);
  // The main resource ignores `status`; the status subresource takes only `status`.
  const next = status ? { ...current, status: o.status } : { ...o, status: current.status, metadata: { ...o.metadata, uid: current.metadata.uid } };
  const stored = store(host, clone(next));
  host.recordWrite(verb, o.metadata.namespace, o.metadata.name ?? "");
  return encodeJson(stored);
}

export function replace(object: Uint8Array): Uint8Array {
  return replaceWith("replace", object, false);
}

export function updateStatus(object: Uint8Array): Uint8Array {
  return replaceWith("update-status", object, true);
}

function patchWith(verb: "patch" | "patch-status", kind: Gvk, namespace: string | undefined, name: string, body: PatchBody): Uint8Array {
  const host = installedHost();
  host.checkFailure(verb);
  const current = existing(host, kind, namespace, name);
  if (body.tag !== "merge") {
    fail("invalid", `the fake host models merge patches only, not ${body.tag}`);
  }
  const patch = decodeJson<{ metadata?: { resourceVersion?: string }; status?: unknown }>(body.val);
  checkVersion(current, patch?.metadata?.resourceVersion);
  const next =
    verb === "patch"
      ? { ...(mergePatch(current, { ...patch, status: undefined }) as KubeObject), status: current.status }
      : { ...current, status: mergePatch(current.status, patch?.status ?? {}) };
  const stored = store(host, next as KubeObject);
  host.recordWrite(verb, namespace, name);
  return encodeJson(stored);
}

export function patch(kind: Gvk, namespace: string | undefined, name: string, body: PatchBody): Uint8Array {
  return patchWith("patch", kind, namespace, name, body);
}

export function patchStatus(kind: Gvk, namespace: string | undefined, name: string, body: PatchBody): Uint8Array {
  return patchWith("patch-status", kind, namespace, name, body);
}

export function apply(object: Uint8Array, _options: { force: boolean; dryRun: boolean; fieldManager?: string }): Uint8Array {
  const host = installedHost();
  host.checkFailure("apply");
  const o = decodeJson<KubeObject>(object);
  const current = host.get(gvkOf(o), o.metadata.namespace, o.metadata.name ?? "");
  const stored = current === undefined ? host.put(o) : store(host, mergePatch(current, o) as KubeObject);
  host.recordWrite("apply", o.metadata.namespace, o.metadata.name ?? "");
  return encodeJson(stored);
}

function remove(
  kind: Gvk,
  namespace: string | undefined,
  name: string,
  options: { uid?: string; resourceVersion?: string; propagation?: string },
): void {
  const host = installedHost();
  host.checkFailure("delete");
  const current = existing(host, kind, namespace, name);
  if (options.uid !== undefined && options.uid !== current.metadata.uid) {
    fail("conflict", `${name}: uid ${options.uid} is not the object's`);
  }
  checkVersion(current, options.resourceVersion);
  if ((current.metadata.finalizers ?? []).length > 0) {
    if (current.metadata.deletionTimestamp === undefined) {
      current.metadata.deletionTimestamp = "2026-01-01T00:00:00Z";
      host.put(current);
    }
  } else {
    host.remove(kind, namespace, name);
  }
  host.recordWrite("delete", namespace, name);
}

export { remove as delete };
