/// <reference path="./runtime.d.ts" />
/**
 * The wasmctrl guest SDK for TypeScript/JavaScript plugins (built with componentize-js).
 *
 * ```ts
 * import { Action, client, exportPlugin, kinds, log, type ConfigMap, type Target } from "@wasmctrl/guest";
 *
 * class Stamp {
 *   static forKind = kinds.ConfigMap;
 *   constructor(_settings: {}) {}
 *   reconcile({ request, object: cm }: Target<ConfigMap>): Action {
 *     if (cm === undefined || cm.data?.stamped) return Action.done; // gone, or already stamped
 *     client.patch(kinds.ConfigMap, request.namespace, request.name, { data: { stamped: "yes" } });
 *     log.info(`stamped ${request.name}`);
 *     return Action.done;
 *   }
 * }
 * export const reconciler = exportPlugin(Stamp);
 * ```
 *
 * A plugin that also admits defines `validate` and/or `mutate` and exports
 * `validator = exportValidator(Cls)` / `mutator = exportMutator(Cls)` (see `admission.ts`).
 */
export * as cache from "./cache.js";
export * as client from "./client.js";
export * as config from "./config.js";
export * as events from "./events.js";
export * as finalizers from "./finalizers.js";
export * as log from "./log.js";
export * as kinds from "./objects.js";
export { HostError, RetryableError, TerminalError, ignoreNotFound, withContext } from "./errors.js";
export type { HostErrorKind } from "./errors.js";
export { Action, exportPlugin } from "./plugin.js";
export { AdmissionRequest, Denied, exportMutator, exportValidator } from "./admission.js";
export type { Mutating, MutatorExport, Operation, UserInfo, Validating, ValidatorExport } from "./admission.js";
export type { FilterInput, Plugin, PluginClass, ReconcilerExport, Target } from "./plugin.js";
export type { ConfigMap, Kind, KubeObject, Namespace, ObjectMeta, OwnerReference, Secret } from "./objects.js";
export {
  annotation,
  isBeingDeleted,
  isKind,
  keyOf,
  kind,
  label,
  requestFor,
} from "./objects.js";
export type { Gvk, Request } from "wasmctrl:controller/types@0.2.1";
