/**
 * Reads from the host's informer caches: fast (no network), possibly slightly stale.
 * Only the kinds the plugin's TOML declares are readable; others throw a `forbidden`
 * {@link HostError}.
 */
import * as wit from "wasmctrl:controller/cache@0.2.1";
import { hostCall } from "./errors.js";
import { decode, type Kind, type KubeObject } from "./objects.js";

/** The cached object, or `undefined` when the cache has none. */
export function get<T extends KubeObject>(kind: Kind<T>, namespace: string | undefined, name: string): T | undefined {
  const bytes = hostCall(() => wit.get(gvk(kind), namespace, name));
  return bytes === undefined ? undefined : decode<T>(bytes);
}

/** What {@link list} selects. */
export interface ListOptions {
  /** Only objects in this namespace. */
  namespace?: string;
  /** A Kubernetes label selector, e.g. `app=web,tier in (a,b),!legacy`. */
  labelSelector?: string;
}

/** Every cached object of `kind` that `options` selects. */
export function list<T extends KubeObject>(kind: Kind<T>, options: ListOptions = {}): T[] {
  const items = hostCall(() => wit.list(gvk(kind), options.namespace, options.labelSelector));
  return items.map((b) => decode<T>(b));
}

/** Objects of `kind` whose index `index` (declared in the TOML, or `namespace`) holds `value`. */
export function byIndex<T extends KubeObject>(kind: Kind<T>, index: string, value: string): T[] {
  const items = hostCall(() => wit.byIndex(gvk(kind), index, value));
  return items.map((b) => decode<T>(b));
}

function gvk(kind: Kind): { apiVersion: string; kind: string } {
  return { apiVersion: kind.apiVersion, kind: kind.kind };
}
