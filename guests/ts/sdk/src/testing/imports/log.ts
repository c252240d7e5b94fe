/** The fake `wasmctrl:controller/log` import: records each line on the installed host. */
import { type LogLine, installedHost } from "../index.js";

export function enabled(_level: LogLine["level"]): boolean {
  return true;
}

export function log(level: LogLine["level"], message: string, fields: Array<[string, string]>): void {
  installedHost().logs.push({ level, message, fields: Object.fromEntries(fields) });
}
