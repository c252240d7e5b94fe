/**
 * The smallest wasmctrl plugin in TypeScript, built with this repository's others (a new
 * plugin outside it: `wasmctrl new NAME --lang ts`, see ../README.md). This one stamps
 * every ConfigMap it is given with `data.stamped = "yes"`.
 */
import { Action, client, exportPlugin, kinds, log, type ConfigMap, type Target } from "@wasmctrl/guest";

/** `[settings]` of the plugin TOML. */
interface Settings {
  /** The value written into `data.stamped` (default "yes"). */
  value?: string;
}

class Stamp {
  /** The kind this plugin was written for; must equal the TOML's `[for]`. */
  static forKind = kinds.ConfigMap;
  private readonly value: string;

  /** Throwing here rejects the plugin version with the message. */
  constructor(settings: Settings) {
    this.value = settings.value ?? "yes";
  }

  /** `object` is the cached ConfigMap, or `undefined` once it is deleted. */
  reconcile({ request, object: cm }: Target<ConfigMap>): Action {
    if (cm === undefined || cm.data?.stamped === this.value) {
      return Action.done; // deleted since it was queued, or already stamped
    }
    client.patch(kinds.ConfigMap, request.namespace, request.name, { data: { stamped: this.value } });
    log.info(`stamped ${request.namespace}/${request.name}`, { value: this.value });
    return Action.done;
  }
}

export const reconciler = exportPlugin(Stamp);
