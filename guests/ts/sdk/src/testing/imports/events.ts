/** The fake `wasmctrl:controller/events` import: records each Event on the installed host. */
import { type RecordedEvent, clone, installedHost } from "../index.js";

export function publish(event: RecordedEvent): void {
  const host = installedHost();
  host.checkFailure("publish");
  host.events.push(clone(event));
}
