/**
 * Kubernetes Events about objects, as `kubectl describe` shows them. The host
 * deduplicates and rate-limits them; a failure throws a {@link HostError}.
 */
import * as wit from "wasmctrl:controller/events@0.2.1";
import { hostCall } from "./errors.js";
import type { KubeObject } from "./objects.js";

/** Records an event of `type` about `regarding` (which needs `apiVersion` and `kind`). */
export function publish(
  regarding: KubeObject,
  type: "normal" | "warning",
  reason: string,
  action: string,
  note: string,
): void {
  const ref = {
    kind: { apiVersion: regarding.apiVersion ?? "", kind: regarding.kind ?? "" },
    namespace: regarding.metadata.namespace,
    name: regarding.metadata.name ?? "",
  };
  hostCall(() => wit.publish({ regarding: ref, type, reason, action, note }));
}

/** A `Normal` event: `events.normal(cm, "Mirrored", "Sync", "copies created in [a]")`. */
export function normal(regarding: KubeObject, reason: string, action: string, note: string): void {
  publish(regarding, "normal", reason, action, note);
}

/** A `Warning` event. */
export function warning(regarding: KubeObject, reason: string, action: string, note: string): void {
  publish(regarding, "warning", reason, action, note);
}
