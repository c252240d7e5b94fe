/**
 * Kubernetes objects as plain JavaScript objects (the JSON the API server speaks), typed
 * by the caller, and the kinds that name them.
 *
 * A {@link Kind} is a `{ apiVersion, kind }` pair carrying the TypeScript type of its
 * objects, so `cache.get(ConfigMap, ns, name)` returns `ConfigMap | undefined` without a
 * cast. The interfaces here cover the metadata every object has and a few core kinds;
 * declare others with {@link kind}.
 */
import type { Gvk, Request } from "wasmctrl:controller/types@0.2.1";

/** `metadata.ownerReferences[]`. */
export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

/** `metadata`. */
export interface ObjectMeta {
  name?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  finalizers?: string[];
  ownerReferences?: OwnerReference[];
  [field: string]: unknown;
}

/** Any Kubernetes object. */
export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
  [field: string]: unknown;
}

/** `v1/ConfigMap`. */
export interface ConfigMap extends KubeObject {
  data?: Record<string, string>;
  binaryData?: Record<string, string>;
  immutable?: boolean;
}

/** `v1/Secret`. */
export interface Secret extends KubeObject {
  type?: string;
  data?: Record<string, string>;
  stringData?: Record<string, string>;
  immutable?: boolean;
}

/** `v1/Namespace`. */
export interface Namespace extends KubeObject {
  spec?: { finalizers?: string[] };
  status?: { phase?: string };
}

/** A kind whose objects have the TypeScript type `T`. */
export interface Kind<T extends KubeObject = KubeObject> extends Gvk {
  /** Never set: carries `T` for type inference only. */
  readonly __object?: T;
}

/** Declares a kind: `const Website = kind<Website>("example.com/v1", "Website")`. */
export function kind<T extends KubeObject = KubeObject>(apiVersion: string, kindName: string): Kind<T> {
  return { apiVersion, kind: kindName };
}

export const ConfigMap: Kind<ConfigMap> = kind("v1", "ConfigMap");
export const Secret: Kind<Secret> = kind("v1", "Secret");
export const Namespace: Kind<Namespace> = kind("v1", "Namespace");

/** Whether `gvk` names `k`. */
export function isKind(gvk: Gvk, k: Gvk): boolean {
  return gvk.apiVersion === k.apiVersion && gvk.kind === k.kind;
}

/** `namespace/name`, or `name` for a cluster-scoped object (as client-go keys objects). */
export function keyOf(o: KubeObject | Request): string {
  const ns = "metadata" in o ? o.metadata.namespace : o.namespace;
  const name = "metadata" in o ? (o.metadata.name ?? "") : o.name;
  return ns ? `${ns}/${name}` : name;
}

/** The reconcile request for `o`. */
export function requestFor(o: KubeObject): Request {
  return { namespace: o.metadata.namespace, name: o.metadata.name ?? "" };
}

export function label(o: KubeObject, key: string): string | undefined {
  return o.metadata.labels?.[key];
}

export function annotation(o: KubeObject, key: string): string | undefined {
  return o.metadata.annotations?.[key];
}

/** Whether `metadata.deletionTimestamp` is set. */
export function isBeingDeleted(o: KubeObject): boolean {
  return o.metadata.deletionTimestamp !== undefined && o.metadata.deletionTimestamp !== null;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** JSON bytes for the host. */
export function encode(value: unknown): Uint8Array {
  return encoder.encode(JSON.stringify(value));
}

/** A value from the host's JSON bytes. */
export function decode<T>(bytes: Uint8Array): T {
  return JSON.parse(decoder.decode(bytes)) as T;
}
