/**
 * A plugin that misbehaves on request, for the host's isolation tests (for ConfigMaps).
 * `reconcile` acts by the request's name:
 * - `throw`: throws a TypeError (the SDK turns it into a retryable reconcile error);
 * - `loop`: never returns (the call's deadline interrupts it);
 * - `alloc`: allocates without bound (the instance's memory cap stops it);
 * - anything else: returns `done` at once (the bare cost of a call).
 * `map` throws, so a hook's exception traps its call.
 */
import { Action, exportPlugin, kinds, type Gvk, type KubeObject, type Request, type Target } from "@wasmctrl/guest";

class Misbehave {
  static forKind = kinds.ConfigMap;
  constructor(_settings: unknown) {}

  reconcile({ request }: Target): Action {
    switch (request.name) {
      case "throw": {
        const missing = undefined as unknown as { field: string };
        return missing.field as unknown as Action;
      }
      case "loop": {
        let n = 0;
        for (;;) {
          n = (n + 1) % 7;
        }
      }
      case "alloc": {
        const hoard: string[][] = [];
        for (;;) {
          hoard.push(new Array<string>(1 << 16).fill(`x${hoard.length}`));
        }
      }
      default:
        return Action.done;
    }
  }

  map(_kind: Gvk, object: KubeObject): Request[] {
    throw new Error(`map refuses ${object.metadata.name}`);
  }
}

export const reconciler = exportPlugin(Misbehave);
