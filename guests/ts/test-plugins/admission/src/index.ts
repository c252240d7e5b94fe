/**
 * An admitting plugin for the host's admission tests (host/tests/admission.rs), the
 * TypeScript twin of guests/test-plugins/admission: on ConfigMaps,
 * - `validate` warns `validated by <stamp>`; refuses `data.deny` (403, its value as the
 *   message) and `data.invalid` (422); `data.throw` throws (the call traps); `data.unique`
 *   is refused when another cached ConfigMap of the namespace has the same value;
 * - `mutate` labels `stamp=<stamp>` and warns `mutated by <stamp>`.
 * `stamp` comes from `[settings]`.
 */
import {
  Action,
  AdmissionRequest,
  cache,
  type ConfigMap,
  Denied,
  exportMutator,
  exportPlugin,
  exportValidator,
  kinds,
  keyOf,
} from "@wasmctrl/guest";

class Admit {
  static forKind = kinds.ConfigMap;
  readonly stamp: string;

  constructor(settings: { stamp?: string }) {
    this.stamp = settings.stamp ?? "";
  }

  reconcile(): Action {
    return Action.done;
  }

  validate(request: AdmissionRequest<ConfigMap>): void {
    request.warn(`validated by ${this.stamp}`);
    const data = request.object?.data ?? {};
    if (data.deny !== undefined) throw new Denied(data.deny);
    if (data.invalid !== undefined) throw Denied.invalid("data.invalid is not allowed");
    if (data.throw !== undefined) throw new TypeError("validate threw on purpose");
    if (data.unique !== undefined) {
      for (const other of cache.list(kinds.ConfigMap, { namespace: request.namespace })) {
        if (other.data?.unique === data.unique && other.metadata.name !== request.name) {
          throw new Denied(`unique value ${data.unique} is taken by ${keyOf(other)}`);
        }
      }
    }
  }

  mutate(request: AdmissionRequest<ConfigMap>): ConfigMap | void {
    const cm = request.object;
    if (cm === undefined) return;
    cm.metadata.labels = { ...(cm.metadata.labels ?? {}), stamp: this.stamp };
    request.warn(`mutated by ${this.stamp}`);
    return cm;
  }
}

export const reconciler = exportPlugin(Admit);
export const validator = exportValidator(Admit);
export const mutator = exportMutator(Admit);
