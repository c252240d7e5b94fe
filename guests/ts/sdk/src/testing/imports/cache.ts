/** The fake `wasmctrl:controller/cache` import: reads the installed {@link FakeHost}'s store. */
import type { Gvk } from "wasmctrl:controller/types@0.2.1";
import type { KubeObject } from "../../objects.js";
import { installedHost } from "../index.js";
import { encodeJson, selects } from "./json.js";

export function get(kind: Gvk, namespace: string | undefined, name: string): Uint8Array | undefined {
  const host = installedHost();
  host.checkFailure("cache.get");
  const o = host.get(kind, namespace, name);
  return o === undefined ? undefined : encodeJson(o);
}

export function list(kind: Gvk, namespace: string | undefined, labelSelector: string | undefined): Uint8Array[] {
  const host = installedHost();
  host.checkFailure("cache.list");
  return host
    .objectsOf(kind, namespace)
    .filter((o: KubeObject) => selects(labelSelector, o.metadata.labels ?? {}))
    .map(encodeJson);
}

export function byIndex(kind: Gvk, index: string, value: string): Uint8Array[] {
  const host = installedHost();
  host.checkFailure("cache.by-index");
  const values =
    index === "namespace" ? (o: KubeObject) => (o.metadata.namespace === undefined ? [] : [o.metadata.namespace]) : host.indexes[index];
  if (values === undefined) {
    throw { payload: { tag: "invalid", val: `no index ${index} (pass it to FakeHost's \`indexes\`)` } };
  }
  return host
    .objectsOf(kind)
    .filter((o) => values(o).includes(value))
    .map(encodeJson);
}
